"""Manifest v1: its columns, the Arrow types each accepts, and the file-level checks of a schema.

Columns `id` and `prompt` are required; the others are optional and may be null per row (the run-level
option or the model's default then applies). Every other column is an extra column, carried through
untouched into the results table.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import pyarrow as pa

from genbatch.jobs.inputs import ROW_INPUTS, Column, accepts
from genbatch.jobs.lora import LORA_TYPE

MANIFEST_VERSION = 1


COLUMNS: dict[str, Column] = {
    column.name: column
    for column in (
        Column("id", "string", True, "unique job id; names the outputs"),
        Column("prompt", "string", True, "the text prompt"),
        Column("negative_prompt", "string", False, "the negative prompt"),
        Column("model", "string", False, "preset name or pipeline directory; overrides the run's model"),
        Column("width", "int", False, "output width in pixels"),
        Column("height", "int", False, "output height in pixels"),
        Column("num_frames", "int", False, "frames (video models only)"),
        Column("num_inference_steps", "int", False, "denoising steps"),
        Column("guidance_scale", "float", False, "guidance scale"),
        Column("seed", "int", False, "int64 noise seed; null derives it from id"),
        Column("fps", "int", False, "frames per second (video models only)"),
        # each per-row input's own (`genbatch.jobs.inputs`)
        *(column for row_input in ROW_INPUTS for column in row_input.columns),
    )
}

RESERVED_EXTRA = {"row": "the results table's 0-based manifest row index",
                  "source_id": "the results table's manifest row id (the row a num_outputs job comes from)"}
"""Names an extra column may not take, because the results table already uses them."""

_EXAMPLES = {"string": "pa.string()", "int": "pa.int64()", "float": "pa.float64()", "count": "pa.int64()",
             "bool": "pa.bool_()",
             "lora": "pa.list_(pa.struct([('uri', pa.string()), ('scale', pa.float64()), "
                     "('weight_name', pa.string())]))"}
_PANDAS_FIX = {"string": ".astype('string')", "int": ".astype('Int64')", "float": ".astype('float64')",
               "count": ".astype('Int64')", "bool": ".astype('boolean')",
               "lora": " as a list of dicts per row"}


class ManifestFileError(ValueError):
    """The manifest cannot be read at all (not Parquet, a required column missing, a column of the wrong type).

    Nothing runs; `gen run` and `gen validate` exit with status 2. The message names the column and the fix.
    """

    def __init__(self, message: str, *, url: str, column: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        """The manifest's URL."""
        self.column = column
        """The column at fault, or None for problems of the whole file."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ManifestSchema:
    """A manifest's columns, checked: the v1 columns it has and its extra columns."""

    arrow: pa.Schema
    """The file's Arrow schema."""
    columns: tuple[str, ...]
    """The v1 columns present, in file order."""
    extra_columns: tuple[str, ...]
    """Every other column, in file order."""

    @property
    def extra_schema(self) -> pa.Schema:
        """The Arrow schema of the extra columns, so results tables can keep their types exactly."""
        return pa.schema([self.arrow.field(name) for name in self.extra_columns])


def _type_error(url: str, name: str, arrow_type: pa.DataType) -> ManifestFileError:
    kind = COLUMNS[name].kind
    wanted = {"string": "a string", "int": "an integer", "float": "a float or integer", "count": "an integer",
              "bool": "a boolean", "lora": f"the adapter list {LORA_TYPE}"}[kind]
    hint = ""
    if kind == "int" and pa.types.is_floating(arrow_type):
        hint = " (pandas turns integer columns with nulls into floats; Int64 keeps the nulls)"
    return ManifestFileError(
        f"{url}: column {name!r} has type {arrow_type}, but it must be {wanted} type ({COLUMNS[name].doc}); "
        f"cast it, e.g. pyarrow table.cast to {_EXAMPLES[kind]} or pandas df[{name!r}]{_PANDAS_FIX[kind]}{hint}",
        url=url,
        column=name,
    )


def check_schema(arrow: pa.Schema, url: str) -> ManifestSchema:
    """The checked schema; raises `ManifestFileError` naming the column and the fix."""
    names = list(arrow.names)
    for name in names:
        if names.count(name) > 1:
            raise ManifestFileError(
                f"{url}: column {name!r} appears {names.count(name)} times; rename or drop the copies",
                url=url,
                column=name,
            )
    for name, column in COLUMNS.items():
        if column.required and name not in names:
            close = [n for n in names if n.lower() == name] or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"rename column {close[0]!r} to {name!r}" if close else f"add a {name!r} column ({column.doc})"
            listed = ", ".join(repr(n) for n in names) or "none"
            raise ManifestFileError(
                f"{url}: the manifest has no {name!r} column (columns: {listed}); {hint}", url=url, column=name
            )
    for field in arrow:
        if field.name in COLUMNS and not accepts(COLUMNS[field.name].kind, field.type):
            raise _type_error(url, field.name, field.type)
        if field.name in RESERVED_EXTRA:
            raise ManifestFileError(
                f"{url}: extra column {field.name!r} clashes with {RESERVED_EXTRA[field.name]}; rename it",
                url=url,
                column=field.name,
            )
    return ManifestSchema(
        arrow=arrow,
        columns=tuple(name for name in names if name in COLUMNS),
        extra_columns=tuple(name for name in names if name not in COLUMNS),
    )
