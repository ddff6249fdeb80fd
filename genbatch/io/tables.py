"""Records to Arrow tables: timing rows, rejected rows and the consolidated results table.

Records are plain dicts of JSON-able values; a column's type is inferred from its non-null values (bool,
int64, float64, string; anything else or a mix becomes its JSON text), so a manifest's extra columns keep
their types in the results without a declared schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TIMING_COLUMNS: dict[str, pa.DataType] = {
    "run_id": pa.string(), "job_id": pa.string(), "rank": pa.int32(), "stage": pa.string(),
    "step": pa.int32(), "start": pa.float64(), "seconds": pa.float64(),
}
_TIMING_REQUIRED = ("run_id", "job_id", "rank", "stage", "start", "seconds")
RESULT_COLUMNS = (
    "id", "source_id", "status", "output_uri", "error", "seed", "model", "width", "height", "num_frames",
    "num_inference_steps", "guidance_scale", "fps",
)
"""The results table's leading columns: `source_id` is the manifest row's id a job came from (its own id unless
the row has `num_outputs` above 1; null for a rejected row)."""
_STATUS_RANK = {"done": 0, "failed": 1, "rejected": 2}


def _infer(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        if all(-(2**63) <= v < 2**63 for v in present):
            return pa.array(values, pa.int64())
    elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, pa.string())
    return pa.array([v if v is None or isinstance(v, str) else json.dumps(v) for v in values], pa.string())


def records_to_table(
    records: Sequence[dict[str, Any]],
    columns_first: Iterable[str] = (),
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """One row per record; `columns_first` lead (and always exist), the rest follow in first-seen order."""
    order = list(dict.fromkeys(columns_first))
    for record in records:
        order.extend(key for key in record if key not in order)
    types = types or {}
    arrays = {}
    for name in order:
        values = [record.get(name) for record in records]
        arrays[name] = pa.array(values, types[name]) if name in types else _infer(values)
    return pa.table(arrays) if arrays else pa.table({})


def timings_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """The Arrow table of timing rows; each needs run_id, job_id, rank, stage, start, seconds (step optional)."""
    for row in rows:
        missing = [key for key in _TIMING_REQUIRED if row.get(key) is None]
        if missing:
            raise ValueError(f"timing row {row!r} lacks {missing}: every row needs {list(_TIMING_REQUIRED)}")
    return records_to_table(rows, TIMING_COLUMNS, TIMING_COLUMNS)


def flatten(record: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts become prefixed columns: {"seconds": {"denoise": 2.0}} -> {"seconds_denoise": 2.0}."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            for inner, item in flatten(value).items():
                flat[f"{key}_{inner}"] = item
        else:
            flat[key] = value
    return flat


def _rejected_rows(rejected: Sequence[dict[str, Any]]) -> list[tuple[Any, dict[str, Any]]]:
    """(key, results row) per rejected manifest row, its problems joined. The key is the row's id, as a job's
    (a row done in an earlier run and rejected now stays done), except where the id itself is what is wrong: a
    duplicate of an earlier row's, or none; then the row number, so that it is a row of its own."""
    grouped: dict[Any, dict[str, Any]] = {}
    own_row: set[Any] = set()
    for record in rejected:
        key = ("row", record.get("row")) if record.get("row") is not None else record.get("id")
        row = grouped.setdefault(key, {**flatten(record), "status": "rejected", "errors": []})
        row["errors"].append(f"{record.get('column')}: {record.get('reason')}")
        if record.get("column") == "id" or record.get("id") in (None, ""):
            own_row.add(key)
    keyed = []
    for key, row in grouped.items():
        row["error"] = "; ".join(row.pop("errors"))
        row.pop("column", None)
        row.pop("reason", None)
        keyed.append((("rejected", key) if key in own_row else row.get("id"), row))
    return keyed


def build_results(
    done: dict[str, dict[str, Any]],
    failed: dict[str, dict[str, Any]],
    rejected: Sequence[dict[str, Any]],
    extra_columns: Sequence[str] = (),
) -> pa.Table:
    """One row per job id (done beats failed beats rejected), and one per rejected row whose id is a duplicate
    or missing; columns: RESULT_COLUMNS, seconds_*, extras, rest."""
    rows: dict[Any, dict[str, Any]] = {}
    candidates = [(job_id, {**flatten(r), "id": job_id, "status": "done"}) for job_id, r in done.items()]
    candidates += [(job_id, {**flatten(r), "id": job_id, "status": "failed"}) for job_id, r in failed.items()]
    candidates += _rejected_rows(rejected)
    for key, row in candidates:
        held = rows.get(key)
        if held is None or _STATUS_RANK[row["status"]] < _STATUS_RANK[held["status"]]:
            rows[key] = row
    ordered = sorted(rows.values(), key=lambda r: (r.get("row") is None, r.get("row") or 0, str(r.get("id"))))
    seconds = sorted({key for row in ordered for key in row if key.startswith("seconds_")})
    first = [*RESULT_COLUMNS, *seconds, *extra_columns]
    return records_to_table(ordered, first)


def to_parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def from_parquet_bytes(data: bytes) -> pa.Table:
    """The table in `data`, read in this thread from an Arrow buffer. (Not `pq.read_table` over a Python file:
    its dataset scanner can drop the last reference to the file on one of Arrow's threads after returning,
    and that thread then needs the GIL; in a process that is finalizing, CPython ends it inside a C++
    destructor and the process aborts.)"""
    return pq.ParquetFile(pa.BufferReader(data)).read()


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Part files may differ in optional columns: unify, filling missing ones with nulls."""
    tables = [t for t in tables if t.num_columns]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")
