"""Every rank's groups for any layout, as a pure function: big layouts are checked without big machines.

The mesh is the row-major grid of `ParallelDims.shape()` over the ranks, in the order of `AXES` (the last
axis varying fastest), as `init_device_mesh` lays it out. A rank's group along some axes is the ranks that
share its coordinates on every other axis, listed in mesh order. `build_context` takes the same groups from
the real DeviceMesh; `tests/parallel/test_mesh_groups.py` checks the two agree on a 512-rank fake mesh.
"""

from __future__ import annotations

import itertools

from genbatch.parallel.axes import AXES, GROUP_AXES, SP_AXES
from genbatch.parallel.dims import ParallelDims


def coordinates(dims: ParallelDims, rank: int) -> dict[str, int]:
    """The rank's index on each axis."""
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"rank {rank} is outside the layout {dims.name} of {dims.world_size} ranks")
    found, rest = {}, rank
    for axis in reversed(AXES):  # the last axis varies fastest
        rest, found[axis] = divmod(rest, dims.degree(axis))
    return {axis: found[axis] for axis in AXES}


def rank_of(dims: ParallelDims, coords: dict[str, int]) -> int:
    rank = 0
    for axis in AXES:
        rank = rank * dims.degree(axis) + coords[axis]
    return rank


def group_ranks(dims: ParallelDims, rank: int, axes: tuple[str, ...]) -> tuple[int, ...]:
    """The ranks that share `rank`'s coordinates on every axis but `axes`, in mesh order."""
    home = coordinates(dims, rank)
    ordered = [axis for axis in AXES if axis in axes]
    ranks = []
    for values in itertools.product(*(range(dims.degree(axis)) for axis in ordered)):
        ranks.append(rank_of(dims, {**home, **dict(zip(ordered, values))}))
    return tuple(ranks)


def rank_groups(dims: ParallelDims, rank: int) -> dict[str, tuple[int, ...]]:
    """Every group the engine takes from the mesh, for one rank: each axis, the job group, the
    sequence-parallel group and FSDP's sub-mesh."""
    groups = {axis: group_ranks(dims, rank, (axis,)) for axis in AXES}
    groups["group"] = group_ranks(dims, rank, GROUP_AXES)
    groups["sp"] = group_ranks(dims, rank, SP_AXES)
    groups["fsdp"] = group_ranks(dims, rank, dims.fsdp_axes)
    return groups
