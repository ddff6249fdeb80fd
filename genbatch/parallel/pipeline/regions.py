"""A patch's part of the latent, and the scheduler stepped once per patch.

A patch holds a range of token rows; its part of the latent is the latent values those tokens were made from:
for a packed latent (b, tokens, c) (FLUX), those tokens; for a latent (b, c, [frames,] height, width) the
pixels of its patches (`patch_size` per dim), row-major as the model's patch embedding orders them.

`PatchSchedulers` steps patch i with its own copy of the scheduler, so each copy advances its step index once
a step (not once per patch) and a multistep solver (UniPC) keeps each patch's own history; `merge_into` gives
the pipeline's scheduler the state of a whole step (each tensor of latent shape taken patch by patch), which is
what a checkpoint saves and a resumed job's synchronous steps continue from.
"""

from __future__ import annotations

import copy

import torch


def region_masks(latents: torch.Tensor, patch_size: tuple[int, ...], ranges: list[tuple[int, int]]) -> list[torch.Tensor]:
    """One bool mask per (start, count) token range, broadcastable to `latents`."""
    if latents.ndim == 3:  # (b, tokens, c): packed, one token per position
        ids = torch.arange(latents.shape[1], device=latents.device).view(1, -1, 1)
    else:
        dims = latents.shape[2:]
        patch = tuple(patch_size)[-len(dims):]
        grid = [size // step for size, step in zip(dims, patch, strict=True)]
        ids = torch.arange(int(torch.tensor(grid).prod()), device=latents.device).view(grid)
        for axis, step in enumerate(patch):  # token grid -> latent grid: each token over its patch's pixels
            ids = ids.repeat_interleave(step, dim=axis)
        ids = ids.view(1, 1, *dims)
    return [(ids >= start) & (ids < start + count) for start, count in ranges]


class PatchSchedulers:
    def __init__(self, scheduler, masks: list[torch.Tensor]):
        self.masks = masks
        self.copies = [copy.deepcopy(scheduler) for _ in masks]

    def step(self, patch: int, noise: torch.Tensor, t, latents: torch.Tensor) -> torch.Tensor:
        """The latent with `patch`'s part stepped (the rest as it was)."""
        stepped = self.copies[patch].step(noise, t, latents, return_dict=False)[0]
        return torch.where(self.masks[patch], stepped, latents)

    def _merged(self, values: list, like: torch.Tensor):
        first = values[0]
        if isinstance(first, torch.Tensor) and first.shape == like.shape:
            merged = first
            for mask, value in zip(self.masks[1:], values[1:], strict=True):
                merged = torch.where(mask, value, merged)
            return merged
        if isinstance(first, list) and all(isinstance(value, list) and len(value) == len(first) for value in values):
            return [self._merged([value[index] for value in values], like) for index in range(len(first))]
        return copy.deepcopy(first)  # the same on every copy: step index, timesteps, sigmas

    def merge_into(self, scheduler, like: torch.Tensor) -> None:
        """Give `scheduler` the whole step's state (`like`: a tensor of the latent's shape)."""
        for name in vars(self.copies[0]):
            setattr(scheduler, name, self._merged([vars(copied)[name] for copied in self.copies], like))
