"""A diffusers scheduler's progress as plain values, and back: what a checkpoint saves and what PipeFusion's
stages share when they resync.

    state = scheduler_state(scheduler)              step index, multistep history, sigmas (tensors on the CPU)
    restore_scheduler(scheduler, state, device)     into a scheduler on which `set_timesteps` just ran

The values are those `torch.load(weights_only=True)` accepts (numpy arrays become tensors).
"""

from __future__ import annotations

import numpy as np
import torch


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
