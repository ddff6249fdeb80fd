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


class Family(Protocol):
    """A family's denoise hooks; each family's hooks class derives from it (and so inherits its defaults)."""

    name: str

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

    def finish(self, pipe, trajectory: Trajectory, latents: torch.Tensor) -> torch.Tensor:
        """The latents after the last step -> the ones the pipeline decodes (Wan 2.2 TI2V puts the image's
        first frame back); the default keeps them."""
        return latents

    def combine(self, predictions: dict[str, torch.Tensor], guidance_scale: float, t) -> torch.Tensor:
        """The guided noise prediction from the branch predictions."""

    def vae_input(self, pipe, job: JobSpec, latents: torch.Tensor) -> torch.Tensor:
        """Final latents -> exactly what the pipeline passes to `vae.decode`."""

    def postprocess(self, pipe, decoded: torch.Tensor) -> np.ndarray:
        """VAE output -> float frames in [0, 1]: (frames, h, w, 3) for video, (h, w, 3) for images."""


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
