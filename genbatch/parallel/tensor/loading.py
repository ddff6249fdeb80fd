"""This rank's part of a full tensor for a parameter tensor parallelism split (filling a meta-built skeleton).

A split module is recorded in `SHARDS` (parameter name -> (dim, blocks), set when its style was applied), so the part
of a full checkpoint tensor a rank keeps is computed from data alone: `block_slice` of the full tensor along
the split's dim, at this rank's tp index. Parameters no style split are returned whole.
"""

from __future__ import annotations

import torch

from genbatch.parallel.tensor.styles import SHARDS, block_slice


def tp_split(module: torch.nn.Module, name: str) -> tuple[int, list[int]] | None:
    """(dim, blocks) of the tp split of `module`'s parameter `name` (dotted), None when it is kept whole."""
    owner, _, attribute = name.rpartition(".")
    return SHARDS.get(module.get_submodule(owner), {}).get(attribute)


def tp_part(module: torch.nn.Module, name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The part of the full tensor `full` of parameter `name` this tp rank holds."""
    split = tp_split(module, name)
    return full if split is None or size == 1 else block_slice(full, split[0], split[1], rank, size)
