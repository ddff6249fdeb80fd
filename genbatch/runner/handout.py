"""Handing jobs to job groups, a batch at a time (`genbatch.jobs.batches`; one job each without
`--batch-size`): dynamically (whichever group is free takes the next batch) or statically.

Dynamic hand-out keeps every group busy while jobs remain: the group leader takes the next index from an
atomic counter in the c10d store that torchrun (or `init_process_group`) already runs, and broadcasts it
to its group. Jobs are in `hand_out_order` (largest first), which bounds the makespan near the ideal.
Static hand-out gives group g the jobs g, g+dp, g+2dp, ... of the same order (for comparison).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from genbatch.jobs.spec import JobSpec
from genbatch.parallel.context import ParallelContext
from genbatch.runner.signals import StopRequest


def coordination_store(ctx: ParallelContext) -> dist.Store:
    """The key-value store every rank of the run shares (the process group's, or a local one)."""
    if ctx.distributed:
        return dist.distributed_c10d._get_default_store()
    return dist.HashStore()


@dataclass(kw_only=True, slots=True)
class HandOut:
    jobs: Sequence[list[JobSpec]]
    """Pending batches of jobs, in hand-out order, identical on every rank."""
    ctx: ParallelContext
    store: dist.Store
    key: str
    """The counter's key: unique per run attempt."""
    dynamic: bool = True
    stop: StopRequest | None = None
    """The run's StopRequest: a signal while the group waits for its next job ends the process (None: not)."""
    _taken: int = 0

    def _next_index(self) -> int:
        if not self.dynamic:
            index = self._taken * self.ctx.dims.dp + self.ctx.dp_rank
            self._taken += 1
            return index
        index = self.store.add(self.key, 1) - 1 if self.ctx.is_leader else -1
        if self.ctx.group.size > 1:
            shared = torch.tensor([index], dtype=torch.int64, device=self.ctx.device)
            self.ctx.group.broadcast(shared, src_group_rank=0)
            index = int(shared.item())
        return index

    def __iter__(self):
        while True:
            with self.stop.waiting("the hand-out") if self.stop is not None else contextlib.nullcontext():
                index = self._next_index()
            if index >= len(self.jobs):
                return
            yield self.jobs[index]
