"""Row rules: a manifest row becomes a `JobSpec`, or is rejected with every one of its problems.

A rejected row costs only itself: the run goes on with the others. Each problem is one `Rejection`
naming the row, its id, the column and the reason (with the fix).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from genbatch.jobs.models import ModelSpec, UnknownModelError, resolve_model
from genbatch.jobs.resolve import SOURCES, Resolved, build_job, resolve_model_name, resolve_settings
from genbatch.jobs.seeds import INT64_MAX, INT64_MIN
from genbatch.jobs.spec import SETTINGS, VIDEO_SETTINGS, JobOverrides, JobSpec

MAX_ID_BYTES = 200
"""Ids name files (`outputs/<id>.mp4`, done markers); file names stop at 255 bytes on most filesystems."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejection:
    """One problem of one manifest row; the row is not run."""

    row: int
    """0-based row index in the manifest."""
    job_id: str | None
    """The row's id, None when it has none."""
    column: str
    """The column at fault."""
    reason: str
    """What is wrong and how to fix it."""
    model: str | None = None
    """The model the row would have run on, when known (for per-model counts and results tables)."""
    extra: dict[str, object] = field(default_factory=dict)
    """The row's extra columns, so a results table can list rejected rows like the others."""

    def message(self) -> str:
        """`row 3 (id 'cat-2'): column 'width': 100 is not a multiple of 16 (use 96)`."""
        who = f"id {self.job_id!r}" if self.job_id else "no id"
        return f"row {self.row} ({who}): column {self.column!r}: {self.reason}"


def _id_problem(job_id: object) -> str | None:
    if job_id is None or not str(job_id).strip():
        return "empty id; give every row a unique non-empty id"
    if job_id in (".", "..") or any(char in job_id for char in "/\\") or any(ord(char) < 32 for char in job_id):
        return f"{job_id!r} cannot name an output file; use an id without '/', '\\', control characters, '.' or '..'"
    if len(job_id.encode("utf-8")) > MAX_ID_BYTES:
        return f"id is {len(job_id.encode('utf-8'))} bytes long; ids name files, keep them to {MAX_ID_BYTES} bytes"
    return None


def _setting_problem(name: str, setting: Resolved | None) -> str | None:
    if setting is None:
        return "no value: the row, the run-level option and the model's defaults all leave it unset; set it"
    value, origin = setting.value, "" if setting.source == "row" else f" ({SOURCES[setting.source]})"
    if name == "guidance_scale":
        if not math.isfinite(value):
            return f"{value} is not a finite number{origin}; use a guidance scale >= 0"
        if value < 0:
            return f"{value} is negative{origin}; use a guidance scale >= 0"
        return None
    if value <= 0:
        return f"{value} must be positive{origin}"
    return None


class RowChecker:
    """Checks rows in manifest order; remembers ids (duplicates) and resolved models (resolved once each)."""

    def __init__(self, *, overrides: JobOverrides, extra_columns: Sequence[str] = ()) -> None:
        self.overrides = overrides
        """The run-level options."""
        self.extra_columns = tuple(extra_columns)
        """Columns carried into `JobSpec.extra`."""
        self._first_row: dict[str, int] = {}
        self._models: dict[str, ModelSpec | str] = {}

    def _model(self, name: str) -> ModelSpec | str:
        """The model's spec, or the reason it cannot be used (cached: a manifest names few models)."""
        if name not in self._models:
            try:
                self._models[name] = resolve_model(name)
            except UnknownModelError as error:
                self._models[name] = str(error)
        return self._models[name]

    def check(self, row: int, values: Mapping[str, object]) -> JobSpec | list[Rejection]:
        """The row's job, or one `Rejection` per problem of the row."""
        job_id = values.get("id")
        extra = {name: values.get(name) for name in self.extra_columns}
        problems: list[tuple[str, str]] = []
        id_problem = _id_problem(job_id)
        if id_problem:
            problems.append(("id", id_problem))
        elif job_id in self._first_row:
            problems.append(("id", f"duplicate id, first used on row {self._first_row[job_id]}; ids must be unique"))
        else:
            self._first_row[job_id] = row
        prompt = values.get("prompt")
        if prompt is None or not prompt.strip():
            problems.append(("prompt", "empty prompt; give the row a prompt"))
        seed = values.get("seed")
        if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
            problems.append(("seed", f"{seed} does not fit in int64; use a seed in [0, 2**63) or leave it null"))
        row_model = values.get("model")
        model = resolve_model_name(row_model, self.overrides)
        spec = self._model(model) if model.strip() else "empty model name; leave it null to use the run's model"
        settings: dict[str, Resolved | None]
        if isinstance(spec, str):
            problems.append(("model", spec))
            # Without a model only the row's own values can be checked.
            settings = {name: Resolved(values[name], "row") for name in SETTINGS if values.get(name) is not None}
        else:
            for name in VIDEO_SETTINGS:
                if not spec.is_video and values.get(name) is not None:
                    problems.append((name, f"{name} applies to video models only and {model} makes images; leave it null"))
            settings = resolve_settings(values, self.overrides, spec)
        bad_settings = set()
        for name, setting in settings.items():
            problem = _setting_problem(name, setting)
            if problem:
                problems.append((name, problem))
                bad_settings.add(name)
        if not isinstance(spec, str) and not bad_settings & {"width", "height", "num_frames"}:
            frames = settings.get("num_frames")
            for column, reason in spec.geometry_problems(
                settings["width"].value, settings["height"].value, None if frames is None else frames.value
            ):
                source = settings[column].source
                problems.append((column, reason + ("" if source == "row" else f" ({SOURCES[source]})")))
        if problems:
            ident = job_id if isinstance(job_id, str) and job_id else None
            return [Rejection(row=row, job_id=ident, column=c, reason=r, model=model, extra=extra) for c, r in problems]
        return build_job(
            row=row,
            job_id=job_id,
            prompt=prompt,
            negative_prompt=values.get("negative_prompt"),
            model=model,
            seed=seed,
            settings=settings,
            extra=extra,
        )

    def check_batch(self, first_row: int, columns: Mapping[str, list]) -> Iterator[JobSpec | list[Rejection]]:
        """`check` over a batch given as {column: values} whose first row has index `first_row`."""
        names = list(columns)
        for offset, row_values in enumerate(zip(*columns.values())):
            yield self.check(first_row + offset, dict(zip(names, row_values)))
