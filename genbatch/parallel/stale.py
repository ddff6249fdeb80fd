"""StaleConfig: how a run approximates attention with stale K/V, and the name its results rows carry.

Exact runs have no `StaleConfig` (None). A run under `--distrifusion P` has one: the method, its P patches and
its W synchronous warm-up steps. Its `label` goes into each job's results row and done marker, and into the
checkpoint's fingerprint, so a changed setting restarts a job instead of resuming a trajectory made under
another approximation.
"""

from __future__ import annotations

from dataclasses import dataclass

DISTRIFUSION = "distrifusion"
"""Each rank one patch; every layer's K/V all-gathered asynchronously and used one step late."""
PIPEFUSION = "pipefusion"
"""The layers in stages; the latent's patches streamed through them, each attending to the other patches' K/V
as last computed (this step's for the earlier patches, the step before's for the later ones)."""
NAIVE_PATCH = "naive_patch"
"""The baseline: the same patches, each attending only to its own keys (no K/V exchange at all)."""
METHODS = (DISTRIFUSION, PIPEFUSION, NAIVE_PATCH)
DEFAULT_WARMUP = {DISTRIFUSION: 4, PIPEFUSION: 1, NAIVE_PATCH: 0}
"""Warm-up steps by method when `--warmup-steps` is not given (distrifuser's and xDiT's defaults)."""
EXACT = "exact"
"""The label of a run without stale attention."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StaleConfig:
    method: str
    """`DISTRIFUSION` or `NAIVE_PATCH`."""
    patches: int
    """Patches the latent's tokens are split into (DistriFusion: its ranks; PipeFusion: `--patches`, by default
    its stages)."""
    warmup_steps: int
    """Synchronous (exact) steps at the start of a job, and again after a resume or a switch to another
    denoiser (Wan 2.2's second expert), whose K/V buffers start empty."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"stale attention method {self.method!r} is unknown; use one of {METHODS}")
        if self.patches < 1 or (self.method == DISTRIFUSION and self.patches < 2):
            raise ValueError(f"{self.method} needs at least 2 patches, got {self.patches}; run exact with 1")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps {self.warmup_steps} must be 0 or more")

    @property
    def label(self) -> str:
        """`distrifusion(patches=2,warmup=4)`: what the results row and the done marker record."""
        return f"{self.method}(patches={self.patches},warmup={self.warmup_steps})"


def stale_config(distrifusion: int, warmup_steps: int | None, pipefusion: int = 1, patches: int | None = None
                 ) -> StaleConfig | None:
    """The run's config from `--distrifusion P` or `--pipefusion P [--patches M]`, with `[--warmup-steps W]`
    (None for an exact run); ValueError naming the flag when `--warmup-steps` or `--patches` is given without a
    method that uses it."""
    if patches is not None and pipefusion <= 1:
        raise ValueError(f"--patches {patches} applies to --pipefusion; drop it, or add --pipefusion P")
    if distrifusion <= 1 and pipefusion <= 1:
        if warmup_steps is not None:
            raise ValueError(f"--warmup-steps {warmup_steps} applies to --distrifusion and --pipefusion; drop it "
                             "for an exact run")
        return None
    method = DISTRIFUSION if distrifusion > 1 else PIPEFUSION
    count = distrifusion if distrifusion > 1 else (pipefusion if patches is None else patches)
    warmup = DEFAULT_WARMUP[method] if warmup_steps is None else warmup_steps
    return StaleConfig(method=method, patches=count, warmup_steps=warmup)


def label(config: StaleConfig | None) -> str:
    """The results row's `attention_approximation`: the config's label, or `exact`."""
    return EXACT if config is None else config.label
