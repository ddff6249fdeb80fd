"""A job's denoising state between two steps: latents, scheduler state and RNG state, as bytes.

Restoring a checkpoint into a freshly built trajectory and scheduler continues the run bit for bit: the
output equals an uninterrupted run's. The payload is loaded with `weights_only=True` (tensors and plain
Python values only), so a checkpoint in shared storage cannot execute code.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch

FORMAT = 1


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
    """The scheduler's state (see `scheduler_state`)."""
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


def _portable(value):
    """Scheduler attributes -> values `torch.load(weights_only=True)` accepts (numpy becomes tensors)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_portable(item) for item in value]
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    return value


# Attributes that are configuration (rebuilt by set_timesteps from the config), not progress.
_SKIPPED = {"_internal_dict", "config"}


def scheduler_state(scheduler) -> dict:
    """Everything a diffusers scheduler mutates while stepping (step index, multistep history, sigmas)."""
    state = {}
    for name, value in vars(scheduler).items():
        if name in _SKIPPED or callable(value):
            continue
        state[name] = {"numpy": isinstance(value, np.ndarray), "tuple": isinstance(value, tuple), "value": _portable(value)}
    return state


def restore_scheduler(scheduler, state: dict, device: torch.device) -> None:
    """Put saved progress into a scheduler on which `set_timesteps` has just run for the same job.

    Tensors go back to the device the fresh scheduler keeps that attribute on (schedulers keep some on the
    CPU on purpose); tensors inside lists (multistep history) go to `device`.
    """
    for name, entry in state.items():
        value = entry["value"]
        if entry["numpy"]:
            value = value.numpy()
        elif entry["tuple"]:
            value = tuple(value)
        current = getattr(scheduler, name, None)
        if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
            value = value.to(current.device)
        else:
            value = _to_device(value, device)
        setattr(scheduler, name, value)


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to_device(item, device) for item in value]
    return value
