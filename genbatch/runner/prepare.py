"""A batch's rows prepared before its first collective, with the outcome agreed on by its whole group.

    batch = prepare_batch(jobs, model, group=ctx.group, media=reader, adapters=adapters, timer=timer)
    batch.jobs        the rows that run (`PreparedJob`), in batch order, the batch's adapters switched in
    batch.failures    the rows that fail alone (`RowFailure`), each with its column and reason

Every rank reads each row's input images itself (`MediaReader`); the batch's adapters (one set: a batch agrees
on it) are read and checked once by the group leader, received by the others (`Adapters.plan`) and merged by each
rank into its own part of the weights. Then the group exchanges one status: each rank's failed rows. A row that
failed on any rank fails on every rank, whatever the cause: a file that is no image fails on all of them, a read
that timed out on one rank fails there alone, and either way the group drops the row and stays in step, since
every rank issued the same collectives (the adapters' broadcast, the exchange) whatever it read. The batch's
other rows run, each as it would alone. A failure inside a collective (a peer lost or hung) is no row's fault: it
is raised, and the run stops with its state kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.io.media_input import MediaError, MediaReader
from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.prepared import PreparedJob, RowFailure
from genbatch.jobs.spec import JobSpec
from genbatch.parallel.comm import Comm
from genbatch.runner.adapters import Adapters, LoraError
from genbatch.runner.errors import describe_error, is_collective_error
from genbatch.runner.timing import JobTimer

LORA_COLUMN = "lora"


@dataclass(kw_only=True, slots=True)
class PreparedBatch:
    """A batch after its preparation: the rows that run and the rows that failed, as the whole group agreed."""

    jobs: list[PreparedJob] = field(default_factory=list)
    """The rows that run, in batch order, with their inputs read."""
    failures: list[RowFailure] = field(default_factory=list)
    """The rows that fail alone, in batch order."""


@dataclass(frozen=True, slots=True)
class _Problem:
    """One rank's failure of one row: what the exchange carries (picklable, no tensors)."""

    index: int
    column: str | None
    reason: str


def _reason(error: BaseException, column: str | None) -> str:
    """The error's message without the `column 'x': ` its own text may start with (the failure names the
    column), and without the `Type: ` prefix for the errors that name their fix themselves."""
    if isinstance(error, (MediaError, LoraError)):
        text = str(error)
        prefix = f"column {column!r}: "
        return text.removeprefix(prefix)
    return describe_error(error)


def _read_media(reader: MediaReader, jobs: list[JobSpec], problems: list[_Problem]) -> list[dict]:
    """Each row's input images, by column ({} for a row without any, or one whose read failed: its problem is
    added)."""
    media: list[dict] = []
    for index, job in enumerate(jobs):
        read = {}
        for column in MEDIA_COLUMNS:
            url = getattr(job, column)
            if url is None:
                continue
            try:
                read[column] = reader.read(column, url)
            except Exception as error:  # noqa: BLE001 - whatever a read raises fails its row, never the group
                if is_collective_error(error):
                    raise
                problems.append(_Problem(index, column, _reason(error, column)))
                break
        media.append(read)
    return media


def _switch_adapters(adapters: Adapters, jobs: list[JobSpec], model, group: Comm, timer: JobTimer,
                     problems: list[_Problem]) -> tuple[str, ...]:
    """Switch the pipeline to the batch's adapter set (the base weights for none; timed as `lora_switch` when
    it changes): each adapter's sha256, or () with every row's problem added when the set cannot be applied."""
    first = jobs[0]
    if not first.lora and not adapters.merged(model.pipe):
        return ()  # nothing merged, nothing asked for: no broadcast either (every rank knows both)
    try:
        switch = adapters.plan(first, model.spec, model.pipe, group)
        if switch.needed:
            with timer.stage("lora_switch"):
                switch.apply()
        return switch.sha256
    except Exception as error:  # noqa: BLE001 - a set that cannot be applied fails the rows that name it
        if is_collective_error(error):
            raise
        reason = _reason(error, LORA_COLUMN)
        problems.extend(_Problem(index, LORA_COLUMN, reason) for index in range(len(jobs)))
        return ()


def _agreed(problems: list[_Problem], group: Comm) -> dict[int, tuple[str | None, str, list[int]]]:
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


def prepare_batch(jobs: list[JobSpec], model, *, group: Comm, media: MediaReader, adapters: Adapters,
                  timer: JobTimer) -> PreparedBatch:
    """The batch's rows prepared and agreed on by `group` (every rank of it calls this for the same batch):
    the rows that run, their adapters switched into `model.pipe`, and the rows that fail alone."""
    problems: list[_Problem] = []
    if any(getattr(job, column) is not None for job in jobs for column in MEDIA_COLUMNS):
        with timer.stage("read_media"):  # the rows' input images, once, on this rank
            read = _read_media(media, jobs, problems)
    else:
        read = [{} for _ in jobs]
    sha256 = _switch_adapters(adapters, jobs, model, group, timer, problems)
    agreed = _agreed(problems, group)
    batch = PreparedBatch()
    for index, job in enumerate(jobs):
        if index in agreed:
            column, reason, ranks = agreed[index]
            everywhere = len(ranks) == group.size
            batch.failures.append(RowFailure(job=job, column=column, reason=reason,
                                             ranks=() if everywhere else tuple(ranks)))
        else:
            batch.jobs.append(PreparedJob.of(job, media=read[index], lora_sha256=sha256))
    return batch
