"""Precedence: a row's own value > the run-level option > the model's default.

Pure functions over plain values, shared by manifest validation (which checks the resolved values and says
where a bad one came from) and anything else that needs a job's effective settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Mapping
from dataclasses import dataclass

from genbatch.jobs.spec import SETTINGS, VIDEO_SETTINGS, JobOverrides

if TYPE_CHECKING:
    from genbatch.models.spec import ModelSpec  # a parameter's type: jobs sit below models

SOURCES = {"row": "the row's value", "run": "the run-level option", "model": "the model's default"}
"""Where a resolved value came from, in words for messages."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """One setting's effective value and where it came from."""

    value: int | float
    """The effective value."""
    source: str
    """`row`, `run` or `model` (keys of `SOURCES`)."""


def resolve_model_name(row_model: str | None, overrides: JobOverrides) -> str | None:
    """The model a row runs on: its own `model`, else the run's `--model`; None when neither names one (there
    is no default model: a forgotten `--model` must not quietly run a random-weight preset)."""
    return row_model if row_model is not None else overrides.model


class SettingResolver:
    """Resolves rows' settings for one model and one set of run-level options (the fallbacks computed once)."""

    def __init__(self, overrides: JobOverrides, spec: ModelSpec) -> None:
        names = [name for name in SETTINGS if spec.is_video or name not in VIDEO_SETTINGS]
        self._fallbacks: dict[str, Resolved | None] = {}
        for name in names:
            candidates = (("run", overrides.value(name)), ("model", spec.defaults.get(name)))
            self._fallbacks[name] = next((Resolved(v, source) for source, v in candidates if v is not None), None)

    def resolve(self, row: Mapping[str, object]) -> dict[str, Resolved | None]:
        """Each setting resolved for the row, None where no level supplies one (a model without that
        default); video-only settings (`num_frames`, `fps`) are left out for image models."""
        resolved = {}
        for name, fallback in self._fallbacks.items():
            value = row.get(name)
            resolved[name] = fallback if value is None else Resolved(value, "row")
        return resolved
