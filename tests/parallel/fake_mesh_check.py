"""Run as a program: build the real DeviceMesh of a layout on torch's fake backend, as ranks RANKS of it in
turn, and check every group against `parallel/groups.py`. Prints one line per rank; exits 1 on a mismatch.

    python -m tests.parallel.fake_mesh_check LAYOUT RANK [RANK ...]
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from genbatch.parallel.axes import AXES, GROUP_AXES, SP_AXES
from genbatch.parallel.dims import ParallelDims
from genbatch.parallel.groups import rank_groups


def mesh_groups(dims: ParallelDims) -> dict[str, list[int]]:
    """This rank's groups as the process groups of the real mesh hold them."""
    mesh = init_device_mesh("cpu", dims.shape(), mesh_dim_names=AXES)
    meshes = {axis: mesh[axis] for axis in AXES}
    meshes["group"] = mesh[GROUP_AXES]._flatten("group")
    meshes["sp"] = mesh[SP_AXES]._flatten("sp")
    meshes["fsdp"] = mesh[dims.fsdp_axes]._flatten("fsdp")
    return {name: dist.get_process_group_ranks(sub.get_group()) for name, sub in meshes.items()}


def main(layout: str, ranks: list[int]) -> int:
    dims = ParallelDims.parse(layout)
    for rank in ranks:
        dist.init_process_group("fake", rank=rank, world_size=dims.world_size, store=FakeStore())
        try:
            real = mesh_groups(dims)
        finally:
            dist.destroy_process_group()
        expected = {name: list(ranks) for name, ranks in rank_groups(dims, rank).items()}
        wrong = {name: (real[name], expected[name]) for name in real if real[name] != expected[name]}
        if wrong:
            print(f"rank {rank}: mesh != pure function: {wrong}")
            return 1
        print(f"rank {rank}: " + " ".join(f"{name}={len(real[name])}@{real[name][0]}" for name in real))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], [int(rank) for rank in sys.argv[2:]]))
