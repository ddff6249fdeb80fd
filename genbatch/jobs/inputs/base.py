"""The protocol of a per-row input: what one declaration says about an input a manifest row may bring.

A per-row input (`image` and `last_image`, `lora`, `cache`, `num_outputs`, ...) is declared once, as a
`RowInput`, and listed once (`genbatch.jobs.inputs.ROW_INPUTS`). The declaration holds:

    columns      its manifest columns and the Arrow types each accepts (`Column`, `accepts`)
    check        its vectorised rule over one record batch (`InputBatch`): each row's resolved values
                 (a null resolved against the run's flags) and the problems of the rows it rejects, each with
                 its column and the message that names the fix (`Checked`)
    resolved     the job table's columns it resolves to, with their Arrow types
    job_fields   a job's `JobSpec` fields from its job-table row
    record       what a results row records of it, before and after preparation
    fingerprint  what of it a checkpoint must match to be resumed, and whether the prompt encode depends on it
    prepare      how a batch's rows are prepared before its first collective (read, converted, checked): a
                 `module:function` of the runner (`genbatch.runner.prepare`), which lives above this layer

The manifest's reading, the job table, `JobSpec`, the checkpoint's fingerprint, the embedding cache and the
executor's preparation all go through the list: a new input is its module here, its line in the list, and the
code that uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from genbatch.jobs.prepared import PreparedJob
    from genbatch.jobs.spec import JobOverrides, JobSpec


@dataclass(frozen=True, slots=True)
class Column:
    """One manifest column."""

    name: str
    """The column name."""
    kind: str
    """`string`, `int`, `float`, `count` (an integer; whole floats too, each row's value checked), `bool` or
    `lora` (which Arrow types are accepted, see `accepts`)."""
    required: bool
    """True when a manifest without this column cannot be read at all."""
    doc: str
    """What the column means, for messages and documentation."""


def accepts(kind: str, arrow_type: pa.DataType) -> bool:
    """Whether a column of `kind` may have this Arrow type (all-null columns of type `null` always may)."""
    if pa.types.is_null(arrow_type):
        return True
    if pa.types.is_dictionary(arrow_type):
        return accepts(kind, arrow_type.value_type)
    if kind == "lora":
        return _adapter_list(arrow_type)
    if kind == "string":
        return (
            pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type)
        )
    if kind == "int":
        return pa.types.is_integer(arrow_type)
    if kind == "bool":
        return pa.types.is_boolean(arrow_type)
    # "count" (num_outputs) as "float": a float column (pandas' integers with nulls) is judged row by row
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)


def _adapter_list(arrow_type: pa.DataType) -> bool:
    """list<struct<uri: string, ...>>, its other fields `scale` (a number), `weight_name` and `expert` (strings)."""
    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
        return False
    entry = arrow_type.value_type
    if not pa.types.is_struct(entry) or entry.get_field_index("uri") < 0:
        return False
    kinds = {"uri": "string", "scale": "float", "weight_name": "string", "expert": "string"}
    return all(entry.field(index).name in kinds and accepts(kinds[entry.field(index).name], entry.field(index).type)
               for index in range(entry.num_fields))


def flags(mask: pa.Array) -> np.ndarray:
    """A boolean Arrow array (nulls false) as a NumPy bool array."""
    import pyarrow.compute as pc

    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


@dataclass(kw_only=True, slots=True)
class InputBatch:
    """What an input's rule sees of one record batch of the manifest: its columns, the run's flags, each row's
    model, and what the row's own rules found of its id."""

    first_row: int
    """The manifest row index of the batch's first row."""
    size: int
    """Rows in the batch."""
    raw: Mapping[str, pa.Array]
    """Each manifest column of the batch (dictionaries decoded); a column the manifest lacks is absent."""
    strings: Mapping[str, pa.Array]
    """The string columns as `pa.string()` arrays, all nulls where the manifest lacks the column."""
    overrides: JobOverrides
    """The run's flags (what a null resolves to)."""
    media_base: str | None
    """Where a relative path points from: the manifest's directory."""
    names: Sequence[str | None]
    """The distinct model names of the batch's rows."""
    models: Sequence[Any]
    """For each distinct name: its model (`.spec`, a `genbatch.models.spec.ModelSpec`) or, as a string, why it
    cannot be used."""
    codes: np.ndarray
    """Per row, its model's index into `names` and `models`."""
    bad_ids: np.ndarray
    """Per row, True when its id cannot be used (the row is rejected for it)."""
    collisions: Mapping[int, list[tuple[str, str]]] = field(default_factory=dict)
    """Manifest row -> its (column, reason) job-id collisions over the whole manifest (`num_outputs`)."""

    def groups(self) -> list[np.ndarray]:
        """The batch's rows grouped by model (each group the offsets of one model's rows, ascending)."""
        if not self.size:
            return []
        order = np.argsort(self.codes, kind="stable")
        return np.split(order, np.flatnonzero(np.diff(self.codes[order])) + 1)


@dataclass(kw_only=True, slots=True)
class Checked:
    """An input's rule over one record batch."""

    resolved: dict[str, pa.Array] = field(default_factory=dict)
    """The input's job-table columns, one value per row of the batch (a rejected row's value is not used)."""
    problems: list[tuple[int, int, str, str]] = field(default_factory=list)
    """(offset in the batch, order among the row's problems, column, reason) of each problem found."""
    counts: np.ndarray | None = None
    """The jobs each row makes, where the input decides it (`num_outputs`); None: one each."""


def no_fields(values: Mapping[str, object]) -> dict[str, object]:
    """`RowInput.job_fields` of an input the job keeps no field of."""
    return {}


def no_record(job: JobSpec) -> dict[str, object]:
    """`RowInput.record` of an input a results row records nothing of."""
    return {}


def no_fingerprint(job: PreparedJob) -> dict[str, object]:
    """`RowInput.fingerprint` of an input a checkpoint need not match."""
    return {}


@dataclass(frozen=True, kw_only=True, slots=True)
class RowInput:
    """One per-row input, declared once (see the module docstring)."""

    name: str
    """Its name (`PreparedJob.prepared` keys its prepared value by it)."""
    columns: tuple[Column, ...]
    """Its manifest columns, in the order messages list them."""
    resolved: tuple[tuple[str, pa.DataType], ...]
    """The job table's columns it resolves to: (name, Arrow type)."""
    check: Callable[[InputBatch], Checked]
    """Its vectorised rule (see `InputBatch`, `Checked`)."""
    job_fields: Callable[[Mapping[str, object]], dict[str, object]] = no_fields
    """A job's `JobSpec` fields from its job-table row (the row's values by column name)."""
    record: Callable[[JobSpec], dict[str, object]] = no_record
    """What a results row records of it (a prepared job's record adds `prepared_record`)."""
    prepared_record: Callable[[PreparedJob], dict[str, object]] = no_record
    """What a results row records of its prepared value (a file's sha256)."""
    fingerprint: Callable[[PreparedJob], dict[str, object]] = no_fingerprint
    """What a checkpoint of the job must match (keys of the checkpoint's fingerprint); {} for none."""
    shapes_encode: bool = False
    """True when the prompt encode depends on it (an edit model's image, a text encoder's LoRA): its
    fingerprint then keys the embedding cache too."""
    prepare: str | None = None
    """`module:function` preparing a batch's rows (`genbatch.runner.prepare`); None: nothing to prepare."""
