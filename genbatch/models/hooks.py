"""What the generic denoise loop needs to know about a model family, and nothing more.

A family turns a job into tensors (prompt embeddings per guidance branch, initial noise, timesteps), runs
one transformer forward for one branch, combines the branches, and turns final latents into pixels. The
loop itself (timing, checkpoints, preemption, CFG-parallel exchange) is family-agnostic: see
`genbatch/runner/denoise.py`. Every family reproduces its diffusers pipeline's `__call__` exactly, so a
genbatch output equals the pipeline's own for the same model, prompt, seed and settings.

Importing this module does not import torch: the hooks of each family import torch and diffusers inside
their methods, so a family's data can be read where torch is not loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from genbatch.io.sound import Soundtrack
    from genbatch.jobs.spec import JobSpec

COND = "cond"
UNCOND = "uncond"


@dataclass(kw_only=True, slots=True)
class Conditioning:
    """The transformer inputs that depend on the prompt, per guidance branch."""

    branches: dict[str, dict[str, Any]]
    """Keyword arguments for the transformer, by branch (`cond`, and `uncond` when CFG is on)."""
    guidance_scale: float
    """Scale applied when combining the branches (unused with one branch)."""


@dataclass(kw_only=True, slots=True)
class Trajectory:
    """The noise, timesteps and per-job constants of one denoising run."""

    latents: torch.Tensor
    """The initial noise, in the family's own latent layout, fp32."""
    timesteps: torch.Tensor
    """The scheduler's timesteps, after `set_timesteps` (the scheduler holds the rest of its state)."""
    shared: dict[str, Any] = field(default_factory=dict)
    """Transformer keyword arguments common to every branch and step (e.g. image position ids)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenGrid:
    """One grid of tokens in the transformer's image stream, which holds its grids one after the other: the
    output's noise, then any conditioning image's latent tokens (FLUX.1 Kontext's, Qwen-Image-Edit's input)."""

    tokens: int
    """Its tokens (frames x rows x row tokens)."""
    row_tokens: int
    """Tokens in one of its rows (a patch of PipeFusion holds whole rows of each grid)."""


class FamilyHooks(Protocol):
    """A family's denoise hooks; each family's hooks class derives from it (and so inherits its defaults)."""

    name: str
    per_row_shared: tuple[str, ...] = ()
    """The `Trajectory.shared` keys that hold one entry per row (a tensor with the batch in dim 0, or a list with
    one item per row: FLUX's `guidance`, Kontext's `image_latents`, Qwen-Image's `img_shapes`); a batch joins
    its rows' entries. Every other shared value is the same for every row of a batch and is taken from the first."""
    shared_branch_keys: tuple[str, ...] = ()
    """The keyword arguments of a `Conditioning` branch that are the same for every row (FLUX's `txt_ids`, the
    text's positions, without a batch dim); a batch joins every other one along the batch."""

    def encode(self, pipe, job: JobSpec, device: torch.device) -> Conditioning:
        """Encode the prompt (and the negative prompt when CFG is on)."""

    def trajectory(self, pipe, job: JobSpec, generator: torch.Generator, device: torch.device) -> Trajectory:
        """Draw the initial noise from `generator` exactly as the pipeline does, and set the timesteps."""

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch: dict[str, Any]) -> torch.Tensor:
        """One transformer forward for one branch at timestep `t` (step index `step`)."""

    def denoiser_at(self, pipe, trajectory: Trajectory, t):
        """The denoiser module that runs at timestep `t`, for families with more than one (Wan 2.2's two
        experts): stale-K/V methods re-warm where it changes. None (the default): one denoiser throughout."""
        return None

    def conditioning_grids(self, pipe, trajectory: Trajectory) -> tuple[TokenGrid, ...]:
        """The grids that follow the noise's in the image stream (a conditioning image's tokens), in stream order;
        the prediction keeps the noise's tokens only. The default: none, the stream is the noise's alone."""
        return ()

    def finish(self, pipe, trajectory: Trajectory, latents: torch.Tensor) -> torch.Tensor:
        """The latents after the last step -> the ones the pipeline decodes (Wan 2.2 TI2V puts the image's
        first frame back); the default keeps them."""
        return latents

    def batch_conditioning(self, rows: list[Conditioning]) -> Conditioning:
        """The conditioning of a batch from its rows' (each encoded alone, batch 1): every tensor joined along
        dim 0, as the pipeline called with a list of prompts batches them. The default suits encoders whose
        outputs have one length (padded to the maximum: T5, CLIP, UMT5, Llama); one row's comes back as a copy
        of its dicts, so a cached encode is never changed."""
        return batch_conditioning(rows, self.shared_branch_keys)

    def batch_trajectory(self, rows: list[Trajectory]) -> Trajectory:
        """The trajectory of a batch from its rows' (each drawn alone from its own generator, as the pipeline
        draws a list of generators' noise): latents and `per_row_shared` joined along the batch."""
        return batch_trajectory(rows, self.per_row_shared)

    def combine(self, predictions: dict[str, torch.Tensor], guidance_scale: float, t) -> torch.Tensor:
        """The guided noise prediction from the branch predictions."""

    def guide(self, pipe, trajectory: Trajectory, predictions: dict[str, torch.Tensor], guidance_scale: float,
              latents: torch.Tensor, step: int) -> torch.Tensor:
        """The guided noise prediction of step `step` from the branch predictions and the latents the step started
        from: `combine`'s, by default (most guidance needs neither). LTX-2's guides the denoised estimate
        x0 = x - sigma v, so it needs the latents and the step's sigma."""
        return self.combine(predictions, guidance_scale, trajectory.timesteps[step])

    def vae_input(self, pipe, job: JobSpec, latents: torch.Tensor) -> torch.Tensor:
        """Final latents -> exactly what the pipeline passes to `vae.decode`."""

    def postprocess(self, pipe, decoded: torch.Tensor) -> np.ndarray:
        """VAE output -> float frames in [0, 1]: (frames, h, w, 3) for video, (h, w, 3) for images."""

    def wants_sound(self, job: JobSpec) -> bool:
        """Whether the row's output carries sound (its `soundtrack` is made): False (the default) for a silent
        family."""
        return False

    def soundtrack(self, pipe, job: JobSpec, latents: torch.Tensor) -> Soundtrack | None:
        """One row's final latents -> its sound, made on the group leader after the frames' decode (for the rows
        that `wants_sound`) and written as the video's audio track."""
        return None


def join_rows(values: list[Any]) -> Any:
    """One batch's value from its rows': tensors joined along dim 0, lists joined, None stays None, anything
    else (the same for every row) the first row's."""
    first = values[0]
    if len(values) == 1:
        return list(first) if isinstance(first, list) else first
    if hasattr(first, "shape"):
        import torch

        return torch.cat(values, dim=0)
    if isinstance(first, list):
        return [item for value in values for item in value]
    return first


def batch_conditioning(rows: list[Conditioning], shared: tuple[str, ...] = ()) -> Conditioning:
    """`FamilyHooks.batch_conditioning`'s default: each branch's keyword arguments joined row by row (`join_rows`),
    the `shared` ones taken from the first row."""
    first = rows[0]
    missing = [name for row in rows for name in first.branches if name not in row.branches]
    if missing or any(len(row.branches) != len(first.branches) for row in rows):
        raise ValueError("the rows of one batch must run the same guidance branches; batch only rows that agree "
                         "on guidance and on having a negative prompt")
    branches = {name: {key: value if key in shared else join_rows([row.branches[name][key] for row in rows])
                       for key, value in kwargs.items()}
                for name, kwargs in first.branches.items()}
    return Conditioning(branches=branches, guidance_scale=first.guidance_scale)


def batch_trajectory(rows: list[Trajectory], per_row: tuple[str, ...]) -> Trajectory:
    """`FamilyHooks.batch_trajectory`'s default: the latents and the `per_row` shared values joined, the timesteps
    (and every other shared value) the first row's."""
    first = rows[0]
    if len(rows) == 1:
        return first
    import torch

    shared = {key: join_rows([row.shared[key] for row in rows]) if key in per_row else value
              for key, value in first.shared.items()}
    return Trajectory(latents=torch.cat([row.latents for row in rows], dim=0), timesteps=first.timesteps,
                      shared=shared)


def classifier_free_guidance(predictions: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
    """uncond + scale * (cond - uncond), as Wan's and SD3's pipelines combine their branches; the conditional
    prediction alone when the job runs without CFG."""
    if UNCOND not in predictions:
        return predictions[COND]
    uncond = predictions[UNCOND]
    return uncond + guidance_scale * (predictions[COND] - uncond)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """[0, 1] floats -> uint8 pixels, rounded the way diffusers' `numpy_to_pil` rounds."""
    import numpy as np

    return (frames * 255).round().astype(np.uint8)
