"""Who decides together, and the indicator they decide on.

A skipped span (FBC: every block after the first) holds collectives: the sequence-parallel all-to-alls or
ring exchanges of each attention, tensor parallel's all-reduces. Every rank that issues one of them must
skip or compute with the others, or the next collective hangs. So the decision is taken over

    the branch's sequence-parallel x tensor-parallel ranks    (the job group minus cfg; the cfg branches
                                                               then decide apart, as one process does)
    the whole job group, under FSDP                           (one joint decision for both cfg branches:
                                                               the output then differs from one process)

and never across dp groups, which run unrelated jobs. The indicator is exact: each rank sums
|r - r_prev| and |r_prev| over its own tokens, the sums are all-reduced, and the ratio is the global
relative L1 of one process (a tensor replicated over tp ranks scales both sums alike).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from genbatch.parallel.comm import Comm
from genbatch.parallel.context import ParallelContext

BRANCH_AXES = ("pp", "ring", "ulysses", "tp")
"""The job-group axes inside one cfg branch: the ranks that share the collectives of a skipped span."""


def decision_comm(ctx: ParallelContext) -> Comm:
    """The group a cache decision is agreed over (see the module docstring). Building it may create a process
    group (cfg 2 with both sequence and tensor parallel, without FSDP): call it on every rank at start-up."""
    if ctx.dims.fsdp or ctx.dims.cfg == 1:
        return ctx.group
    if ctx.dims.tp == 1:
        return ctx.sp
    if ctx.dims.sp == 1:
        return ctx.tp_comm
    return Comm(ctx.mesh[BRANCH_AXES]._flatten("cache").get_group(), ctx.ledger)


def relative_l1(current: torch.Tensor, previous: torch.Tensor, comm: Comm) -> float:
    """sum|current - previous| / sum|previous| over every rank of `comm` (this rank holding its shard): one
    all-reduce of two float64 sums and one host read, the same value on every rank.

    In a batch (dim 0 > 1, `--batch-size`) each row's change is measured on its own and the largest is taken,
    so a batch computes every step that one of its rows alone would compute."""
    if current.shape[0] > 1:
        # (b, ...) -> (2, b): each row's change and scale
        sums = torch.stack([(current - previous).abs().flatten(1).sum(1, dtype=torch.float64),
                            previous.abs().flatten(1).sum(1, dtype=torch.float64)])
    else:
        sums = torch.stack([(current - previous).abs().sum(dtype=torch.float64),
                            previous.abs().sum(dtype=torch.float64)])
    if comm.size > 1:
        comm.all_reduce(sums, op=dist.ReduceOp.SUM, kind="control")
    changes, scales = sums.reshape(2, -1).tolist()
    return max(change / scale if scale > 0 else float("inf") for change, scale in zip(changes, scales, strict=True))
