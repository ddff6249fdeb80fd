"""The manifest's rules stated row by row, as a reader would: an oracle that the column-wise checker
(`genbatch.manifests.columns.ColumnChecker`, the one implementation genbatch runs) is held to over random
manifests (tests/manifests/test_columns.py). Each rule's message comes from genbatch's own function, so what is
compared is which rows each rule rejects, in which order, and what the valid rows resolve to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from genbatch.jobs.ids import MAX_ID_BYTES
from genbatch.jobs.inputs import audio as audio_input
from genbatch.jobs.inputs import cache as cache_input
from genbatch.jobs.inputs import lora as lora_input
from genbatch.jobs.inputs import num_outputs as outputs
from genbatch.jobs.inputs.media import MEDIA_COLUMNS, media_problems
from genbatch.jobs.media import media_url
from genbatch.jobs.resolve import Resolved, resolve_model_name
from genbatch.jobs.seeds import job_seed, output_seed
from genbatch.jobs.spec import SETTINGS, VIDEO_SETTINGS, JobOverrides, JobSpec
from genbatch.manifests import validate
from genbatch.manifests.validate import ModelRules, Rejection


def build_job(*, row: int, job_id: str, prompt: str, negative_prompt: str | None, model: str, seed: int | None,
              settings: Mapping[str, Resolved | None], extra: dict[str, object], **inputs) -> JobSpec:
    """A `JobSpec` from resolved settings that the rules accepted (every required one present), with the
    inputs' fields `inputs`."""

    def value(name: str) -> int | float | None:
        setting = settings.get(name)
        return None if setting is None else setting.value

    return JobSpec(
        id=job_id, prompt=prompt, negative_prompt=negative_prompt, model=model, width=int(value("width")),
        height=int(value("height")), num_frames=None if value("num_frames") is None else int(value("num_frames")),
        num_inference_steps=int(value("num_inference_steps")), guidance_scale=float(value("guidance_scale")),
        seed=job_seed(seed, job_id), fps=None if value("fps") is None else int(value("fps")), extra=extra, row=row,
        **{name: tuple(value) if name == "lora" else value for name, value in inputs.items()},
    )


class JobIds:
    """The job ids of the rows seen so far, in manifest order, first use kept: row by row, what
    `id_space.collisions` finds over a whole manifest."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[int, bool]] = {}  # job id -> (the first row with it, derived by num_outputs)

    def add(self, row: int, job_id: str, count: int) -> list[tuple[str, str]]:
        """Record a row whose own id is usable; the (column, reason) problems of its ids an earlier row has.
        An id both rows have as their own, or both derive, is the duplicate rule's, not this one's."""
        problems = []
        held = self._first.get(job_id)
        if held is not None and held[1]:
            problems.append(("id", outputs.id_collision(job_id, held[0])))
        derived = [] if count == 1 else outputs.job_ids(job_id, count)
        taken = [(name, self._first[name][0]) for name in derived if name in self._first and not self._first[name][1]]
        if taken:
            name, first_row = taken[0]
            problems.append((outputs.COLUMN, outputs.outputs_collision(count, name, first_row, len(taken) - 1)))
        self._first.setdefault(job_id, (row, False))
        for name in derived:
            self._first.setdefault(name, (row, True))
        return problems


def row_jobs(job: JobSpec, count: int, seed: int | None) -> tuple[JobSpec, ...]:
    """The jobs of a checked row (`job`: the row as one job; `seed`: the row's own, None when null)."""
    if count == 1:
        return (job,)
    return tuple(dataclasses.replace(job, id=name, source_id=job.id, seed=output_seed(seed, name, k))
                 for k, name in enumerate(outputs.job_ids(job.id, count)))


class RowRules:
    """Checks rows in manifest order; remembers ids (duplicates) and models (resolved once each)."""

    def __init__(self, *, overrides: JobOverrides, extra_columns: Sequence[str] = (),
                 media_base: str | None = None) -> None:
        self.overrides = overrides
        self.extra_columns = tuple(extra_columns)
        self.media_base = media_base
        self._first_row: dict[str, int] = {}
        self._job_ids = JobIds()
        self._models = ModelRules(overrides)

    def check(self, row: int, values: Mapping[str, object]) -> tuple[JobSpec, ...] | list[Rejection]:
        """The row's jobs (a tuple: one, or one per output of its `num_outputs`), or one `Rejection` per
        problem of the row (a list)."""
        get = values.get
        job_id, prompt, seed = get("id"), get("prompt"), get("seed")
        problems: list[tuple[str, str]] = []
        id_problem = validate.id_problem(job_id)
        if id_problem:
            problems.append(("id", id_problem))
        elif job_id in self._first_row:
            problems.append(("id", validate.duplicate_problem(self._first_row[job_id])))
        else:
            self._first_row[job_id] = row
        if prompt is None or not prompt.strip():
            problems.append(("prompt", validate.EMPTY_PROMPT))
        seed_problem = validate.seed_problem(seed)
        if seed_problem:
            problems.append(("seed", seed_problem))
        model_name = resolve_model_name(get("model"), self.overrides)
        model = self._models.model(model_name)
        if isinstance(model, str):
            problems.append(("model", model))
            # Without a model only the row's own values can be checked.
            settings = {name: Resolved(get(name), "row") for name in SETTINGS if get(name) is not None}
        else:
            if not model.spec.is_video:
                problems.extend((name, validate.video_only_problem(name, model_name))
                                for name in VIDEO_SETTINGS if get(name) is not None)
            settings = model.resolver.resolve(values)
        bad_settings = set()
        for name, setting in settings.items():
            problem = validate.setting_problem(name, setting)
            if problem:
                problems.append((name, problem))
                bad_settings.add(name)
        if not isinstance(model, str) and not bad_settings & {"width", "height", "num_frames"}:
            problems.extend(self._models.geometry_problems(model.spec, settings))
        cache = cache_input.problem(get("cache"))
        if cache:
            problems.append(("cache", cache))
        if not isinstance(model, str):
            problems.extend(media_problems(model.spec, model_name, values))
            if get("audio") is not None and not model.spec.makes_sound:
                problems.append(("audio", audio_input.audio_problem(model_name)))
        adapters = lora_input.job_adapters(get("lora"), self.overrides.lora, self.media_base)
        if isinstance(adapters, str):
            problems.append(("lora", adapters))
        count_value = get(outputs.COLUMN)
        count_problem = outputs.count_problem(count_value)
        if count_problem:
            problems.append((outputs.COLUMN, count_problem))
        count = outputs.output_count(count_value)
        length = None if id_problem else outputs.length_problem(job_id, count, MAX_ID_BYTES)
        if length:
            problems.append(("id", length))
        last_seed = None if seed_problem else outputs.seed_problem(seed, count)
        if last_seed:
            problems.append(("seed", last_seed))
        if not id_problem:
            problems.extend(self._job_ids.add(row, job_id, count))
        extra = {name: get(name) for name in self.extra_columns}
        if problems:
            ident = job_id if job_id else None
            return [Rejection(row=row, job_id=ident, column=c, reason=r, model=model_name, extra=extra)
                    for c, r in problems]
        job = build_job(
            row=row, job_id=job_id, prompt=prompt, negative_prompt=get("negative_prompt"), model=model_name,
            seed=seed, settings=settings, extra=extra,
            cache=cache_input.job_cache(get("cache"), self.overrides.cache), lora=adapters,
            audio=model.spec.makes_sound if get("audio") is None else bool(get("audio")),
            **{column: media_url(get(column), self.media_base) for column in MEDIA_COLUMNS if get(column) is not None},
        )
        return row_jobs(job, count, seed)

    def check_batch(self, first_row: int,
                    columns: Mapping[str, list]) -> Iterator[tuple[JobSpec, ...] | list[Rejection]]:
        """`check` over a batch given as {column: values} whose first row has index `first_row`."""
        names = list(columns)
        for offset, row_values in enumerate(zip(*columns.values(), strict=True)):
            yield self.check(first_row + offset, dict(zip(names, row_values, strict=True)))
