"""A batch's rows prepared before its first collective, with the outcome agreed on by its whole group.

    batch = prepare_batch(jobs, PrepareContext(model=..., group=ctx.group, media=..., adapters=..., timer=...))
    batch.jobs        the rows that run (`PreparedJob`), in batch order, the batch's adapters switched in
    batch.failures    the rows that fail alone (`RowFailure`), each with its column and reason

Each per-row input that has something to prepare (`genbatch.jobs.inputs.ROW_INPUTS`, its `prepare`: a function
of `genbatch.runner.prepare_inputs`) prepares the batch's rows in turn: every rank reads each row's input images
itself; the batch's adapters (one set: a batch agrees on it) are read and checked once by the group leader,
received by the others and merged by each rank into its own part of the weights. Then the group exchanges one
status: each rank's failed rows. A row that failed on any rank fails on every rank, whatever the cause: a file
that is no image fails on all of them, a read that timed out on one rank fails there alone, and either way the
group drops the row and stays in step, since every rank issued the same collectives (the adapters' broadcast,
the exchange) whatever it read. The batch's other rows run, each as it would alone. A failure inside a
collective (a peer lost or hung) is no row's fault: it is raised, and the run stops with its state kept.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from genbatch.io.media_input import MediaReader
from genbatch.jobs.inputs import ROW_INPUTS
from genbatch.jobs.prepared import PreparedJob, RowFailure
from genbatch.jobs.spec import JobSpec
from genbatch.parallel.comm import Comm
from genbatch.runner.adapters import Adapters
from genbatch.runner.timing import JobTimer

if TYPE_CHECKING:
    from genbatch.runner.execute import JobModel


@dataclass(frozen=True, slots=True)
class Problem:
    """One rank's failure of one row: what the exchange carries (picklable, no tensors)."""

    index: int
    """The row's place in its batch."""
    column: str | None
    """The manifest column to blame, or None."""
    reason: str
    """What went wrong and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PrepareContext:
    """What an input's preparation works with on this rank."""

    model: JobModel
    """The batch's model (its spec, its family's hooks, its pipeline)."""
    group: Comm
    """The batch's job group."""
    media: MediaReader
    """Reads rows' input images under the run's policy and retry budget."""
    adapters: Adapters
    """Prepares adapters once each and switches them into a pipeline."""
    timer: JobTimer
    """The batch's timer (preparation's stages: `read_media`, `lora_switch`)."""


Preparation = Callable[[PrepareContext, list[JobSpec], list[Problem]], list[object]]
"""An input's preparation: each row's prepared value (None: nothing for that row), its failed rows' problems
appended."""


@dataclass(kw_only=True, slots=True)
class PreparedBatch:
    """A batch after its preparation: the rows that run and the rows that failed, as the whole group agreed."""

    jobs: list[PreparedJob] = field(default_factory=list)
    """The rows that run, in batch order, with their inputs prepared."""
    failures: list[RowFailure] = field(default_factory=list)
    """The rows that fail alone, in batch order."""


def _preparation(reference: str) -> Preparation:
    """The function a `RowInput.prepare` names (`module:function`)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _agreed(problems: list[Problem], group: Comm) -> dict[int, tuple[str | None, str, list[int]]]:
    """Row index -> (column, reason, the global ranks that saw it) over the whole group, the lowest rank's
    reason first; one exchange (none in a group of one)."""
    seen: dict[int, tuple[str | None, str, list[int]]] = {}
    for group_rank, reported in enumerate(group.all_gather_object(problems)):
        rank = group.global_rank(group_rank) if group.size > 1 else group_rank
        for problem in reported:
            _, _, ranks = seen.setdefault(problem.index, (problem.column, problem.reason, []))
            if rank not in ranks:
                ranks.append(rank)
    return seen


def prepare_batch(jobs: list[JobSpec], context: PrepareContext) -> PreparedBatch:
    """The batch's rows prepared and agreed on by `context.group` (every rank of it calls this for the same
    batch): the rows that run, their inputs prepared, and the rows that fail alone."""
    problems: list[Problem] = []
    prepared: list[dict[str, object]] = [{} for _ in jobs]
    for row_input in ROW_INPUTS:
        if row_input.prepare is None:
            continue
        values = _preparation(row_input.prepare)(context, jobs, problems)
        for row, value in zip(prepared, values, strict=True):
            if value is not None:
                row[row_input.name] = value
    agreed = _agreed(problems, context.group)
    batch = PreparedBatch()
    for index, job in enumerate(jobs):
        if index in agreed:
            column, reason, ranks = agreed[index]
            everywhere = len(ranks) == context.group.size
            batch.failures.append(RowFailure(job=job, column=column, reason=reason,
                                             ranks=() if everywhere else tuple(ranks)))
        else:
            batch.jobs.append(PreparedJob.of(job, prepared[index]))
    return batch
