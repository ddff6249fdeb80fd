"""Failed jobs: recorded with their error, without losing the run.

A row whose inputs cannot be prepared (an unreadable image, an adapter for another model) fails alone before
its batch's first collective, as its whole group agreed (`genbatch.runner.prepare`; `record_row_failures`), in
any layout. What fails later, while the batch runs: in a one-rank group any exception fails just that batch and
the run goes on. In a multi-rank group a
failure that is not known to be identical on every rank (anything but non-finite latents) leaves peers
waiting inside a collective, so the group cannot go on: each rank posts what it saw to the run's
coordination store, the failure record names the rank that raised or stopped responding, and the process
exits with REQUEUE (75: the run stopped and a rerun continues, as after a preemption; Slurm requeues it).
Each failure record counts the run attempts the job has failed in; a job that has failed in --max-attempts
runs is not handed out again, so a job that always fails cannot hold a run back.
"""

from __future__ import annotations

import time
import traceback

from genbatch.jobs.prepared import RowFailure
from genbatch.jobs.spec import JobSpec
from genbatch.runner.errors import describe_error, is_collective_error, out_of_memory
from genbatch.runner.execute import NonFiniteLatents

_GRACE_SECONDS = 2.0  # how long peers get to post what they saw before the failure is written


def _release_memory(error: BaseException) -> None:
    """After an out-of-memory failure: drop the failed job's tensors (held by the traceback's frames) and hand
    the cached blocks back, so the next job starts from an empty allocator rather than a fragmented one."""
    import torch

    traceback.clear_frames(error.__traceback__)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure_record(job: JobSpec, message: str, run_id: str, rank: int, column: str | None = None) -> dict:
    """A failed job's record (its failure marker, later its results row): the job's fields, `error` (the first
    line says what failed), the `column` to blame when one is, the run and the rank that wrote it."""
    return {**job.record(), "status": "failed", "error": message, "column": column, "run_id": run_id,
            "rank": rank, "finished_at": time.time()}


def record_row_failures(ctx, store, failures: list[RowFailure], run_id: str) -> None:
    """The group leader records each row its batch's preparation failed (the group agreed on them: nothing is
    left in a collective, and the group goes on with its next batch)."""
    if not ctx.is_leader:
        return
    for failure in failures:
        store.record_failure(failure.job.id, failure_record(failure.job, failure.message(), run_id, ctx.rank,
                                                            column=failure.column))


class GroupFailure(Exception):
    """A job (or a batch's jobs) failed on part of a multi-rank group; the group's collectives are no longer usable."""

    def __init__(self, jobs: list[JobSpec], message: str, rank: int):
        super().__init__(message)
        self.jobs, self.message, self.rank = jobs, message, rank

    def record(self, store, run_id: str) -> None:
        for job in self.jobs:
            store.record_failure(job.id, failure_record(job, self.message, run_id, self.rank))


def record_failure(ctx, store, jobs: list[JobSpec], error: BaseException, run_id: str) -> None:
    """Record the failed jobs of one batch (a failure fails its own batch and no other), or raise GroupFailure
    when the group cannot go on."""
    job = jobs[0]
    if ctx.group.size == 1 or isinstance(error, NonFiniteLatents):
        if ctx.is_leader:
            for failed in jobs:
                store.record_failure(failed.id, failure_record(failed, describe_error(error), run_id, ctx.rank))
        if out_of_memory(error):
            _release_memory(error)
        return
    from genbatch.runner.handout import coordination_store

    coordination = coordination_store(ctx)
    prefix = f"genbatch/{run_id}/failure/{job.id}"
    collective = is_collective_error(error)
    coordination.set(f"{prefix}/{ctx.rank}", ("peer" if collective else "raised") + "\t" + describe_error(error))
    time.sleep(_GRACE_SECONDS)
    group_ranks = [ctx.group.global_rank(r) for r in range(ctx.group.size)]
    raised, silent = [], []
    for rank in group_ranks:
        key = f"{prefix}/{rank}"
        if coordination.check([key]):
            kind, text = coordination.get(key).decode().split("\t", 1)
            if kind == "raised":
                raised.append(f"rank {rank} raised {text}")
        else:
            silent.append(rank)
    if raised:
        cause = "; ".join(raised)
    elif silent:
        cause = (f"{'rank' if len(silent) == 1 else 'ranks'} {', '.join(map(str, silent))} stopped responding "
                 "(died or hung; collective timeout applies)")
    else:
        cause = describe_error(error)
    names = ", ".join(failed.id for failed in jobs)
    message = f"job {names} failed on ranks {group_ranks}: {cause}"
    if not collective:
        message += "\n" + "".join(traceback.format_exception(error)[-3:])
    raise GroupFailure(jobs, message, ctx.rank) from error
