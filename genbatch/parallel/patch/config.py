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
NAIVE_PATCH = "naive_patch"
"""The baseline: the same patches, each attending only to its own keys (no K/V exchange at all)."""
METHODS = (DISTRIFUSION, NAIVE_PATCH)
DEFAULT_WARMUP = {DISTRIFUSION: 4, NAIVE_PATCH: 0}
"""Warm-up steps by method when `--warmup-steps` is not given (DistriFusion's: distrifuser's default)."""
EXACT = "exact"
"""The label of a run without stale attention."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StaleConfig:
    method: str
    """`DISTRIFUSION` or `NAIVE_PATCH`."""
    patches: int
    """Patches the latent's tokens are split into (the ranks of the distrifusion axis)."""
    warmup_steps: int
    """Synchronous (exact) steps at the start of a job, and again after a resume or a switch to another
    denoiser (Wan 2.2's second expert), whose K/V buffers start empty."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"stale attention method {self.method!r} is unknown; use one of {METHODS}")
        if self.patches < 2:
            raise ValueError(f"{self.method} needs at least 2 patches, got {self.patches}; run exact with 1")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps {self.warmup_steps} must be 0 or more")

    @property
    def label(self) -> str:
        """`distrifusion(patches=2,warmup=4)`: what the results row and the done marker record."""
        return f"{self.method}(patches={self.patches},warmup={self.warmup_steps})"


def stale_config(distrifusion: int, warmup_steps: int | None) -> StaleConfig | None:
    """The run's config from `--distrifusion P [--warmup-steps W]` (None for an exact run); ValueError naming
    the flag when `--warmup-steps` is given without a method that uses it."""
    if distrifusion <= 1:
        if warmup_steps is not None:
            raise ValueError(f"--warmup-steps {warmup_steps} applies to --distrifusion; drop it for an exact run")
        return None
    warmup = DEFAULT_WARMUP[DISTRIFUSION] if warmup_steps is None else warmup_steps
    return StaleConfig(method=DISTRIFUSION, patches=distrifusion, warmup_steps=warmup)


def label(config: StaleConfig | None) -> str:
    """The results row's `attention_approximation`: the config's label, or `exact`."""
    return EXACT if config is None else config.label
