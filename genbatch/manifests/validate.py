"""Row rules: a manifest row becomes its `JobSpec`s (one, or one per output: `outputs`), or is rejected with
every one of its problems.

A rejected row costs only itself: the run goes on with the others. Each problem is one `Rejection`
naming the row, its id, the column and the reason (with the fix).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from genbatch.jobs.cache import cache_problem, canonical_cache
from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.jobs.lora import LoraRef, parse_lora
from genbatch.jobs.media import MEDIA_COLUMNS, media_url
from genbatch.jobs.resolve import SOURCES, Resolved, SettingResolver, build_job, resolve_model_name
from genbatch.jobs.seeds import INT64_MAX, INT64_MIN
from genbatch.jobs.spec import SETTINGS, VIDEO_SETTINGS, JobOverrides, JobSpec
from genbatch.manifests import outputs
from genbatch.models import resolve_model

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
    subject: str | None = None
    """What the reason is about, when it is the row's own value (the image URL that does not exist): said
    beside the row, so that rows sharing the reason group into one cause (`genbatch.manifests.causes`)."""

    @property
    def full_reason(self) -> str:
        """The reason with its subject: `/data/a.png: no such file; ...`."""
        return self.reason if self.subject is None else f"{self.subject}: {self.reason}"

    def message(self) -> str:
        """`row 3 (id 'cat-2'): column 'width': 100 is not a multiple of 16 (use 96)`."""
        who = f"id {self.job_id!r}" if self.job_id else "no id"
        return f"row {self.row} ({who}): column {self.column!r}: {self.full_reason}"


_UNSAFE_ID = re.compile(r"[/\\\x00-\x1f\x7f]")


def _id_problem(job_id: str | None) -> str | None:
    if job_id is None or not job_id.strip():
        return "empty id; give every row a unique non-empty id"
    if _UNSAFE_ID.search(job_id) or job_id in (".", ".."):
        return f"{job_id!r} cannot name an output file; use an id without '/', '\\', control characters, '.' or '..'"
    if len(job_id) * 4 > MAX_ID_BYTES and len(job_id.encode("utf-8")) > MAX_ID_BYTES:
        return f"id is {len(job_id.encode('utf-8'))} bytes long; ids name files, keep them to {MAX_ID_BYTES} bytes"
    return None


EMPTY_PROMPT = "empty prompt; give the row a prompt"


def _seed_problem(seed: int | None) -> str | None:
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        return f"{seed} does not fit in int64; use a seed in [0, 2**63) or leave it null"
    return None


def _video_only_problem(name: str, model_name: str) -> str:
    return f"{name} applies to video models only and {model_name} makes images; leave it null"


def _duplicate_problem(first_row: int) -> str:
    return f"duplicate id, first used on row {first_row}; ids must be unique"


def _cache_problem(value: str | None) -> str | None:
    """Why a row's own `cache` value cannot run (None: null, or a valid mode)."""
    if value is None:
        return None
    problem = cache_problem(value)
    return problem and f"{problem}; or leave it null for the run's --cache"


def media_problems(spec: ModelSpec, model_name: str, values: Mapping[str, object]) -> list[tuple[str, str]]:
    """The (column, reason) pairs of a row's media columns the model cannot take: an image for a model that
    takes none, none where the model needs one, an empty value."""
    problems = []
    for column in MEDIA_COLUMNS:
        value = values.get(column)
        if value is None and column in spec.media_required:
            problems.append((column, f"{model_name} starts from {'an image' if column == 'image' else 'a last frame'}"
                                     f", and the row names none; fill `{column}` with a path (relative to the "
                                     "manifest) or URL"))
        elif value is not None and not str(value).strip():
            problems.append((column, "empty; name an image (a path or URL) or leave it null"))
        elif value is not None and column not in spec.media_inputs:
            takes = (f"it takes {' and '.join(spec.media_inputs)} only" if spec.media_inputs
                     else "it is a text-only model")
            problems.append((column, f"{model_name} takes no {column} ({takes}); drop the column's value, or "
                                     "run the row on an image-conditioned model (tiny-wan-i2v)"))
    return problems


def job_adapters(value: object, overrides: JobOverrides, base: str | None) -> tuple[LoraRef, ...] | str:
    """A row's adapters (its `lora`, else the run's `--lora`), or the reason its value cannot be used."""
    try:
        adapters = parse_lora(value, base)
    except ValueError as error:
        return f"{error}; or leave it null for the run's --lora"
    return overrides.lora if adapters is None else adapters


def job_cache(value: str | None, overrides: JobOverrides) -> str:
    """The canonical mode of a valid row: its own `cache`, else the run's `--cache`, else `none`."""
    return canonical_cache(value if value is not None else overrides.cache)


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


@dataclass(frozen=True, slots=True)
class _Model:
    """A usable model, with its settings' fallbacks resolved once."""

    name: str
    spec: ModelSpec
    resolver: SettingResolver


class RowChecker:
    """Checks rows in manifest order; remembers ids (duplicates) and resolved models (resolved once each).

    The rules row by row, as a reader would state them. Runs check whole columns at once with
    `genbatch.manifests.columns.ColumnChecker`, which gives the same jobs and the same rejections."""

    def __init__(self, *, overrides: JobOverrides, extra_columns: Sequence[str] = (),
                 media_base: str | None = None) -> None:
        self.overrides = overrides
        """The run-level options."""
        self.extra_columns = tuple(extra_columns)
        """Columns carried into `JobSpec.extra`."""
        self.media_base = media_base
        """Where a relative media path points from: the manifest's directory (`jobs.media.manifest_base`)."""
        self._first_row: dict[str, int] = {}
        self._job_ids = outputs.JobIds()
        self._models: dict[str, _Model | str] = {}
        self._geometry: dict[tuple, list[tuple[str, str]]] = {}

    def _model(self, name: str | None) -> _Model | str:
        """The model, or the reason it cannot be used (cached: a manifest names few models)."""
        if name not in self._models:
            if name is None:
                self._models[name] = "no model: the row names none and the run has no --model; pass --model or fill it"
            elif not name.strip():
                self._models[name] = "empty model name; leave it null to use the run's model"
            else:
                try:
                    spec = resolve_model(name)
                    self._models[name] = _Model(name=name, spec=spec, resolver=SettingResolver(self.overrides, spec))
                except UnknownModelError as error:
                    self._models[name] = str(error)
        return self._models[name]

    def geometry_problems(self, spec: ModelSpec, settings: Mapping[str, Resolved | None]) -> list[tuple[str, str]]:
        """The (column, reason) pairs of the row's sizes the model cannot take (cached per distinct size)."""
        frames = settings.get("num_frames")
        key = (spec.name, settings["width"], settings["height"], frames)
        if key not in self._geometry:
            problems = spec.geometry_problems(
                settings["width"].value, settings["height"].value, frames and frames.value
            )
            self._geometry[key] = [
                (
                    column,
                    reason + ("" if settings[column].source == "row" else f" ({SOURCES[settings[column].source]})"),
                )
                for column, reason in problems
            ]
        return self._geometry[key]

    def check(self, row: int, values: Mapping[str, object]) -> tuple[JobSpec, ...] | list[Rejection]:
        """The row's jobs (a tuple: one, or one per output of its `num_outputs`), or one `Rejection` per
        problem of the row (a list)."""
        get = values.get
        job_id, prompt, seed = get("id"), get("prompt"), get("seed")
        problems: list[tuple[str, str]] = []
        id_problem = _id_problem(job_id)
        if id_problem:
            problems.append(("id", id_problem))
        elif job_id in self._first_row:
            problems.append(("id", _duplicate_problem(self._first_row[job_id])))
        else:
            self._first_row[job_id] = row
        if prompt is None or not prompt.strip():
            problems.append(("prompt", EMPTY_PROMPT))
        seed_problem = _seed_problem(seed)
        if seed_problem:
            problems.append(("seed", seed_problem))
        model_name = resolve_model_name(get("model"), self.overrides)
        model = self._model(model_name)
        if isinstance(model, str):
            problems.append(("model", model))
            # Without a model only the row's own values can be checked.
            settings = {name: Resolved(get(name), "row") for name in SETTINGS if get(name) is not None}
        else:
            if not model.spec.is_video:
                problems.extend(
                    (name, _video_only_problem(name, model_name)) for name in VIDEO_SETTINGS if get(name) is not None
                )
            settings = model.resolver.resolve(values)
        bad_settings = set()
        for name, setting in settings.items():
            problem = _setting_problem(name, setting)
            if problem:
                problems.append((name, problem))
                bad_settings.add(name)
        if not isinstance(model, str) and not bad_settings & {"width", "height", "num_frames"}:
            problems.extend(self.geometry_problems(model.spec, settings))
        cache = _cache_problem(get("cache"))
        if cache:
            problems.append(("cache", cache))
        if not isinstance(model, str):
            problems.extend(media_problems(model.spec, model_name, values))
        adapters = job_adapters(get("lora"), self.overrides, self.media_base)
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
            return [
                Rejection(row=row, job_id=ident, column=c, reason=r, model=model_name, extra=extra) for c, r in problems
            ]
        job = build_job(
            row=row,
            job_id=job_id,
            prompt=prompt,
            negative_prompt=get("negative_prompt"),
            model=model_name,
            seed=seed,
            settings=settings,
            extra=extra,
            cache=job_cache(get("cache"), self.overrides),
            lora=adapters,
            **{column: media_url(get(column), self.media_base) for column in MEDIA_COLUMNS if get(column) is not None},
        )
        return outputs.row_jobs(job, count, seed)

    def check_batch(self, first_row: int,
                    columns: Mapping[str, list]) -> Iterator[tuple[JobSpec, ...] | list[Rejection]]:
        """`check` over a batch given as {column: values} whose first row has index `first_row`."""
        names = list(columns)
        for offset, row_values in enumerate(zip(*columns.values(), strict=True)):
            yield self.check(first_row + offset, dict(zip(names, row_values, strict=True)))
