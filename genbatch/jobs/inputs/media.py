"""The `image` and `last_image` inputs: a row's input images by URL (`genbatch.jobs.media`), checked against its
model (an image for a model that takes none, none where the model needs one), read before its batch runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput, flags
from genbatch.jobs.media import MEDIA_COLUMNS, media_url

if TYPE_CHECKING:
    from genbatch.models.spec import ModelSpec

ORDER = {name: 40 + index for index, name in enumerate(MEDIA_COLUMNS)}
"""Where each column's problems stand among a row's."""


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


def _check(batch: InputBatch) -> Checked:
    """Each model's rows against what it takes (on the rows that name media, and on every row of a model that
    needs an image); the URLs made absolute (a relative path from the manifest's directory)."""
    checked = Checked()
    strings = batch.strings
    for group in batch.groups():
        code = int(batch.codes[group[0]])
        model = batch.models[code]
        if isinstance(model, str):
            continue  # the row is rejected for its model
        named = np.zeros(len(group), dtype=bool)
        for column in MEDIA_COLUMNS:
            named |= ~flags(pc.is_null(strings[column].take(pa.array(group, pa.int64()))))
        rows = group if model.spec.media_required else group[named]
        if not len(rows):
            continue
        index = pa.array(rows, pa.int64())
        values = {column: strings[column].take(index).to_pylist() for column in MEDIA_COLUMNS}
        for position, offset in enumerate(rows.tolist()):
            row = {column: values[column][position] for column in MEDIA_COLUMNS}
            checked.problems.extend((int(offset), ORDER[column], column, reason)
                                    for column, reason in media_problems(model.spec, batch.names[code], row))
    for column in MEDIA_COLUMNS:
        values = strings[column]
        if values.null_count < len(values):  # a manifest without images pays no Python loop for them
            values = pa.array([None if value is None else media_url(value, batch.media_base)
                               for value in values.to_pylist()], pa.string())
        checked.resolved[column] = values
    return checked


def _fields(values: Mapping[str, object]) -> dict[str, object]:
    return {column: values[column] for column in MEDIA_COLUMNS}


def _sha256(job) -> dict[str, object]:
    return {f"{column}_sha256": media.sha256 for column, media in job.media.items()}


def _fingerprint(job) -> dict[str, object]:
    # a changed input image restarts the job (a text-only job's fingerprint has no such key)
    return {"media": {column: media.sha256 for column, media in sorted(job.media.items())}} if job.media else {}


MEDIA = RowInput(
    name="media",
    columns=(Column("image", "string", False,
                    "the conditioning image: a path (relative to the manifest) or any fsspec URL"),
             Column("last_image", "string", False, "first-and-last-frame video: the last frame, as `image`")),
    resolved=tuple((column, pa.string()) for column in MEDIA_COLUMNS),
    check=_check,
    job_fields=_fields,
    record=lambda job: {column: getattr(job, column) for column in MEDIA_COLUMNS},
    prepared_record=_sha256,
    fingerprint=_fingerprint,
    shapes_encode=True,
    prepare="genbatch.runner.prepare_inputs:read_media",
)
