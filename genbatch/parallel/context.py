"""ParallelContext: the one DeviceMesh of a run and the groups taken from it by axis name.

Built once per process from a validated `ParallelDims`, over every axis of `parallel/axes.py` (dp, cfg,
distrifusion, pp, ring, ulysses, tp; those of degree 1 too). Every group the parallel layer uses comes from here
(never from module-level globals): `group` (the job group: every axis but dp), `cfg`, `distrifusion` (the
patch ranks), `sp` (ring x ulysses), `ring`,
`ulysses`, `tp`, and the sub-mesh FSDP shards over (`fsdp_mesh`: by default the job group minus tp and pp). Each
group is a `Comm`, so its collectives count bytes into the one ledger. `parallel/groups.py` computes the same
groups as a pure function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from genbatch.parallel.comm import Comm, CommLedger
from genbatch.parallel.axes import AXES, GROUP_AXES, SP_AXES
from genbatch.parallel.dims import ParallelDims


@dataclass(kw_only=True, slots=True)
class ParallelContext:
    dims: ParallelDims
    """The validated layout."""
    device: torch.device
    """This rank's device (cuda:LOCAL_RANK, or cpu)."""
    ledger: CommLedger
    """Bytes this rank sent, by collective kind, since the last step boundary."""
    mesh: object | None
    """The DeviceMesh over every axis of `AXES`; None in a one-process run."""
    rank: int
    """Global rank."""
    dp_rank: int
    """Which job group this rank belongs to."""
    group: Comm
    """The ranks running this rank's job (every axis but dp); group rank 0 is the leader."""
    cfg: Comm
    sp: Comm
    distrifusion: Comm | None = None
    """The DistriFusion patch ranks; None stands for this rank alone (`patch_comm`)."""
    pp: Comm | None = None
    """The PipeFusion stages, in stage order; None stands for this rank alone (`pp_comm`)."""
    ring: Comm
    ulysses: Comm
    tp: Comm | None = None
    """The tensor-parallel ranks (consecutive); None stands for this rank alone (`tp_comm`)."""
    tp_mesh: object | None = None
    """The tp axis as a 1-D DeviceMesh (what `parallelize_module` splits weights over); None in a one-process run."""
    group_mesh: object | None = None
    """The job group as a 1-D DeviceMesh; None in a one-process run."""
    fsdp_mesh: object | None = None
    """The 1-D DeviceMesh FSDP2 shards over (`dims.fsdp_axes`); None in a one-process run."""

    @property
    def is_leader(self) -> bool:
        """True on the rank that writes this group's outputs."""
        return self.group.rank == 0

    @property
    def holds_latents(self) -> bool:
        """True on the rank that writes its group's checkpoints: the leader; under PipeFusion the last stage's
        rank at the leader's other coordinates (between asynchronous steps only the last stage holds the whole
        latent)."""
        if self.dims.pp == 1:
            return self.is_leader
        return self.pp_comm.rank == self.dims.pp - 1 and self.cfg.rank == 0 and self.sp.rank == 0

    @property
    def patch_comm(self) -> Comm:
        """The distrifusion group's `Comm` (this rank alone when there is none)."""
        return self.distrifusion if self.distrifusion is not None else Comm(None, self.ledger)

    @property
    def pp_comm(self) -> Comm:
        """The pp group's `Comm` (this rank alone when there is none)."""
        return self.pp if self.pp is not None else Comm(None, self.ledger)

    @property
    def tp_comm(self) -> Comm:
        """The tp group's `Comm` (this rank alone when there is no tp group)."""
        return self.tp if self.tp is not None else Comm(None, self.ledger)

    @property
    def distributed(self) -> bool:
        return self.mesh is not None


def single_process_context(device: torch.device) -> ParallelContext:
    """The context of a plain one-process run: every group is just this rank."""
    ledger = CommLedger()
    solo = Comm(None, ledger)
    return ParallelContext(
        dims=ParallelDims(), device=device, ledger=ledger, mesh=None, rank=0, dp_rank=0,
        group=solo, cfg=solo, sp=solo, ring=solo, ulysses=solo,
    )


def build_context(dims: ParallelDims, device: torch.device) -> ParallelContext:
    """Build the mesh for an initialised process group and take every group from it by name."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        return single_process_context(device)
    mesh = init_device_mesh(device.type, dims.shape(), mesh_dim_names=AXES)
    ledger = CommLedger()
    group_mesh = mesh[GROUP_AXES]._flatten("group")
    sp_mesh = mesh[SP_AXES]._flatten("sp")
    fsdp_axes = tuple(axis for axis in GROUP_AXES if axis in dims.fsdp_axes)
    same_ranks = all(dims.degree(axis) == 1 for axis in GROUP_AXES if axis not in fsdp_axes)
    fsdp_mesh = group_mesh if same_ranks else mesh[fsdp_axes]._flatten("fsdp")

    def comm(sub_mesh) -> Comm:
        return Comm(sub_mesh.get_group(), ledger)

    return ParallelContext(
        dims=dims,
        device=device,
        ledger=ledger,
        mesh=mesh,
        rank=dist.get_rank(),
        dp_rank=mesh["dp"].get_local_rank(),
        group=comm(group_mesh),
        cfg=comm(mesh["cfg"]),
        distrifusion=comm(mesh["distrifusion"]),
        pp=comm(mesh["pp"]),
        sp=comm(sp_mesh),
        ring=comm(mesh["ring"]),
        ulysses=comm(mesh["ulysses"]),
        tp=comm(mesh["tp"]),
        tp_mesh=mesh["tp"],
        group_mesh=group_mesh,
        fsdp_mesh=fsdp_mesh,
    )
