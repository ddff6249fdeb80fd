"""The row's own rules, as messages: its id, prompt, seed, model and settings; and what a rejection says.

A rejected row costs only itself: the run goes on with the others. Each problem is one `Rejection` naming the
row, its id, the column and the reason (with the fix). `genbatch.manifests.columns.ColumnChecker` applies these
rules, and each per-row input's (`genbatch.jobs.inputs`), to whole columns at once; the functions here say
what is wrong with one value, and are called on the rows the column-wise masks flag.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from genbatch.jobs.resolve import SOURCES, Resolved, SettingResolver
from genbatch.jobs.schedule import SpecOf
from genbatch.jobs.seeds import row_seed_problem
from genbatch.jobs.ids import MAX_ID_BYTES
from genbatch.jobs.spec import JobOverrides
from genbatch.models import resolve_model
from genbatch.models.spec import ModelSpec, UnknownModelError

__all__ = ["MAX_ID_BYTES", "Rejection", "ModelRules"]


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


def id_problem(job_id: str | None) -> str | None:
    """Why a row's id cannot name its outputs (None: it can)."""
    if job_id is None or not job_id.strip():
        return "empty id; give every row a unique non-empty id"
    if _UNSAFE_ID.search(job_id) or job_id in (".", ".."):
        return f"{job_id!r} cannot name an output file; use an id without '/', '\\', control characters, '.' or '..'"
    if len(job_id) * 4 > MAX_ID_BYTES and len(job_id.encode("utf-8")) > MAX_ID_BYTES:
        return f"id is {len(job_id.encode('utf-8'))} bytes long; ids name files, keep them to {MAX_ID_BYTES} bytes"
    return None


EMPTY_PROMPT = "empty prompt; give the row a prompt"


def seed_problem(seed: int | None) -> str | None:
    """Why a row's own seed cannot be used (None: null, or it fits in int64)."""
    return row_seed_problem(seed)


def video_only_problem(name: str, model_name: str) -> str:
    return f"{name} applies to video models only and {model_name} makes images; leave it null"


def duplicate_problem(first_row: int) -> str:
    return f"duplicate id, first used on row {first_row}; ids must be unique"


def setting_problem(name: str, setting: Resolved | None) -> str | None:
    """Why a resolved setting cannot run (None: it can), naming where a value not the row's came from."""
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
class Model:
    """A usable model, with its settings' fallbacks resolved once."""

    name: str
    spec: ModelSpec
    resolver: SettingResolver


class ModelRules:
    """The models rows name, resolved once each, and the sizes they are checked at, once per distinct size."""

    def __init__(self, overrides: JobOverrides, spec_of: SpecOf = resolve_model) -> None:
        self.overrides = overrides
        self.spec_of = spec_of
        """Resolves a model name to its spec (`resolve_model`; `gen validate`: `resolve_model_or_published`)."""
        self._models: dict[str | None, Model | str] = {}
        self._geometry: dict[tuple, list[tuple[str, str]]] = {}

    def model(self, name: str | None) -> Model | str:
        """The model, or the reason it cannot be used."""
        if name not in self._models:
            if name is None:
                self._models[name] = "no model: the row names none and the run has no --model; pass --model or fill it"
            elif not name.strip():
                self._models[name] = "empty model name; leave it null to use the run's model"
            else:
                try:
                    spec = self.spec_of(name)
                    self._models[name] = Model(name=name, spec=spec, resolver=SettingResolver(self.overrides, spec))
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
