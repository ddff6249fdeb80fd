"""A job's denoising state between two steps: latents, scheduler state and RNG state, as bytes.

Restoring a checkpoint into a freshly built trajectory and scheduler continues the run bit for bit: the
output equals an uninterrupted run's. The payload is loaded with `weights_only=True` (tensors and plain
Python values only), so a checkpoint in shared storage cannot execute code.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

FORMAT = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPolicy:
    """When a running job saves its denoising state: every `every_steps` steps, but not more often than
    every `every_seconds` seconds (a cap on checkpoint I/O when steps are fast). A stop signal always
    checkpoints, whatever the policy."""

    every_steps: int = 10
    """Steps between checkpoints (0: no periodic checkpoints)."""
    every_seconds: float = 0.0
    """The least time between two checkpoints of a job, counted from its start (0: no cap)."""

    def due(self, steps_since: int, seconds_since: float) -> bool:
        return self.every_steps > 0 and steps_since >= self.every_steps and seconds_since >= self.every_seconds


@dataclass(kw_only=True, slots=True)
class DenoiseCheckpoint:
    job_id: str
    """The job this state belongs to."""
    fingerprint: dict
    """The job settings that must match to resume (model, seed, sizes, steps, guidance, prompt hash)."""
    steps_done: int
    """Denoising steps completed; the resumed run starts at this step index."""
    latents: torch.Tensor
    """Latents after `steps_done` steps, on the CPU."""
    scheduler: dict
    """The scheduler's state (`genbatch.models.scheduler_state.scheduler_state`)."""
    rng: dict
    """CPU RNG state and the job generator's state."""

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(
            {
                "format": FORMAT,
                "job_id": self.job_id,
                "fingerprint": self.fingerprint,
                "steps_done": self.steps_done,
                "latents": self.latents.detach().cpu(),
                "scheduler": self.scheduler,
                "rng": self.rng,
            },
            buffer,
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "DenoiseCheckpoint":
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {FORMAT}; delete it to restart the job")
        del state["format"]
        return cls(**state)
