"""How each per-row input that has something to prepare is prepared for a batch (`RowInput.prepare` names
these): before the batch's first collective, each row's problem noted rather than raised
(`genbatch.runner.prepare` then has the group agree on them).

    read_media        the `media` input: each row's images, read by this rank
    switch_adapters   the `lora` input: the batch's adapter set, read and checked by the group leader, merged
                      by each rank into its part of the weights
"""

from __future__ import annotations

from genbatch.io.media_input import MediaError
from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.spec import JobSpec
from genbatch.runner.adapters import LoraError
from genbatch.runner.errors import describe_error, is_collective_error
from genbatch.runner.prepare import PrepareContext, Problem

LORA_COLUMN = "lora"


def _reason(error: BaseException, column: str | None) -> str:
    """The error's message without the `column 'x': ` its own text may start with (the failure names the
    column), and without the `Type: ` prefix for the errors that name their fix themselves."""
    if isinstance(error, (MediaError, LoraError)):
        return str(error).removeprefix(f"column {column!r}: ")
    return describe_error(error)


def read_media(context: PrepareContext, jobs: list[JobSpec], problems: list[Problem]) -> list[object]:
    """Each row's input images, by column (None for a row without any, or one whose read failed: its problem is
    added); timed as `read_media` when the batch has any."""
    if not any(getattr(job, column) is not None for job in jobs for column in MEDIA_COLUMNS):
        return [None] * len(jobs)
    media: list[object] = []
    with context.timer.stage("read_media"):  # the rows' input images, once, on this rank
        for index, job in enumerate(jobs):
            read = {}
            for column in MEDIA_COLUMNS:
                url = getattr(job, column)
                if url is None:
                    continue
                try:
                    read[column] = context.media.read(column, url)
                except Exception as error:  # noqa: BLE001 - whatever a read raises fails its row, never the group
                    if is_collective_error(error):
                        raise
                    problems.append(Problem(index, column, _reason(error, column)))
                    read = {}
                    break
            media.append(read or None)
    return media


def switch_adapters(context: PrepareContext, jobs: list[JobSpec], problems: list[Problem]) -> list[object]:
    """Switch the pipeline to the batch's adapter set (the base weights for none; timed as `lora_switch` when it
    changes): each row's adapters' sha256, or every row's problem when the set cannot be applied."""
    model, adapters = context.model, context.adapters
    first = jobs[0]
    if not first.lora and not adapters.merged(model.pipe):
        return [None] * len(jobs)  # nothing merged, nothing asked for: no broadcast either (every rank knows both)
    try:
        switch = adapters.switch_for(first, model.spec, model.pipe, context.group)
        if switch.needed:
            with context.timer.stage("lora_switch"):
                switch.apply()
    except Exception as error:  # noqa: BLE001 - a set that cannot be applied fails the rows that name it
        if is_collective_error(error):
            raise
        reason = _reason(error, LORA_COLUMN)
        problems.extend(Problem(index, LORA_COLUMN, reason) for index in range(len(jobs)))
        return [None] * len(jobs)
    return [switch.sha256 or None] * len(jobs)
