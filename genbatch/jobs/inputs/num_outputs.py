"""Several outputs per row: a row's `num_outputs` K makes K jobs, `<id>-0` to `<id>-(K-1)`.

Output k runs with the row's `seed` plus k, or without a seed with the hash of its own id
(`genbatch.jobs.seeds.output_seed`); everything else is the row's. K = 1 (null, or no column) keeps the row's
own id and seed: such a manifest runs exactly as before. Every job keeps its row's index (`row`) and id
(`source_id`).

The ids K derives share one namespace with the rows' own ids: a row whose own id an earlier row derives, or
which derives an earlier row's own id, is rejected, as a duplicate id is, naming the id and the earlier row.
(Two rows derive the same id only when they have the same id: `<a>-k` ends in the one integer k, so that is
the duplicate rule's to say.) This module holds the rules (the messages), the input's declaration
(`NUM_OUTPUTS`: its vectorised check) and the expansion of a checked record batch into its jobs; the whole
manifest's namespace, column-wise, is `genbatch.manifests.id_space`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput
from genbatch.jobs.seeds import INT64_MAX, row_seed_problem
from genbatch.jobs.ids import MAX_ID_BYTES

COLUMN = "num_outputs"
MAX_OUTPUTS = 1000
"""The most jobs one row may make: a larger count is far more likely a typo than a wish."""
_RANGE = f"use an integer from 1 to {MAX_OUTPUTS}, or leave it null for one output"


def count_problem(value: object) -> str | None:
    """Why a row's `num_outputs` cannot be used (None: null, or a count from 1 to `MAX_OUTPUTS`)."""
    if value is None:
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return f"{value} is not a whole number; {_RANGE}"
        value = int(value)
    if value < 1:
        return f"{value} outputs: a row makes at least one; {_RANGE}"
    if value > MAX_OUTPUTS:
        return (f"{value} outputs is more than the {MAX_OUTPUTS} one row may make; split the row into several "
                f"(other ids, other seeds) or {_RANGE}")
    return None


def output_count(value: object) -> int:
    """The jobs a row makes: its `num_outputs`, 1 when null or unusable (a bad count rejects the row)."""
    return 1 if value is None or count_problem(value) is not None else int(value)


def derived_id(job_id: str, k: int) -> str:
    """The id of output `k` of the row `job_id`."""
    return f"{job_id}-{k}"


def output_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows making `counts[i]` jobs each, one entry per job in row order: (its row, its k)."""
    counts = np.asarray(counts, np.int64)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return rows, np.arange(len(rows), dtype=np.int64) - np.repeat(starts, counts)


def derived_ids(ids: pa.Array, k: np.ndarray) -> pa.Array:
    """`derived_id` column-wise: each id with its output's k, `<id>-k`."""
    return pc.binary_join_element_wise(ids, pa.array(k).cast(pa.string()), "-")


def job_ids(job_id: str, count: int) -> list[str]:
    """The ids of a row's jobs: its own id alone when it makes one."""
    return [job_id] if count == 1 else [derived_id(job_id, k) for k in range(count)]


def length_problem(job_id: str, count: int, max_bytes: int) -> str | None:
    """Why the longest id a row derives cannot name a file (None: it can, or the row makes one job)."""
    if count == 1:
        return None
    size = len(derived_id(job_id, count - 1).encode("utf-8"))
    if size <= max_bytes:
        return None
    suffix = size - len(job_id.encode("utf-8"))
    return (f"num_outputs {count} makes ids of up to {size} bytes (this id and '-{count - 1}'); ids name files, "
            f"keep this one to {max_bytes - suffix} bytes or lower num_outputs")


def seed_problem(seed: int | None, count: int) -> str | None:
    """Why the last output's seed (`seed` + count - 1) does not fit in int64 (None: it does, or no seed)."""
    if seed is None or count == 1 or seed + count - 1 <= INT64_MAX:
        return None
    return (f"{seed} plus {count - 1} (one seed per output, num_outputs {count}) does not fit in int64; use a "
            f"seed up to {INT64_MAX - count + 1}, or leave it null")


def id_collision(job_id: str, row: int) -> str:
    """The `id` problem of a row whose own id an earlier row's `num_outputs` derives."""
    return (f"{job_id!r} is already a job id of row {row} (from its num_outputs); job ids must be unique, "
            "rename this row or that one")


def outputs_collision(count: int, job_id: str, row: int, more: int) -> str:
    """The `num_outputs` problem of a row that derives an earlier row's id (`job_id`, the first such; `more`
    others)."""
    others = f" (and {more} more of this row's ids)" if more else ""
    return (f"num_outputs {count} derives {job_id!r}, already the id of row {row}{others}; job ids must be "
            "unique, rename one of the rows or lower num_outputs")


def expand(batch: pa.RecordBatch, counts: np.ndarray) -> pa.RecordBatch:
    """A record batch of checked rows' resolved columns (`genbatch.jobs.table.COLUMNS`) as their jobs: each
    row `counts[i]` times, the copies' ids `<id>-k` and seeds the row's plus k (null stays null: the job's
    seed is then its own id's hash). Rows of count 1 stay as they are."""
    counts = np.asarray(counts, np.int64)
    if not len(counts) or (counts == 1).all():
        return batch
    take, k = output_index(counts)
    copies = batch.take(pa.array(take))
    many = pa.array(np.repeat(counts > 1, counts))
    ids = copies.column("id")
    names = derived_ids(ids, k)
    columns: Mapping[str, pa.Array] = {
        "id": pc.if_else(many, names, ids),
        "seed": pc.add_checked(copies.column("seed"), pa.array(k)),  # int64: validation kept the sums inside
    }
    return pa.record_batch([columns.get(name, copies.column(name)) for name in copies.schema.names],
                           schema=copies.schema)


def output_counts(values: pa.Array | pa.ChunkedArray | None, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(the jobs each row makes, the rows whose value `count_problem` may reject) for a `num_outputs` column
    (None: no column), column-wise: nulls and unusable values count 1."""
    if values is None or pa.types.is_null(values.type):
        return np.ones(size, np.int64), np.zeros(size, bool)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_floating(values.type):
        numbers = values.cast(pa.float64())
        odd = pc.or_(pc.invert(pc.is_finite(numbers)), pc.not_equal(pc.floor(numbers), numbers))
    else:
        numbers, odd = values, pa.nulls(len(values), pa.bool_())
    outside = pc.or_(pc.less(numbers, 1), pc.greater(numbers, MAX_OUTPUTS))
    suspects = pc.fill_null(pc.or_(pc.fill_null(odd, False), outside), False)
    unusable = pc.or_(suspects, pc.is_null(values))
    counts = pc.if_else(unusable, pa.scalar(1, pa.int64()), numbers.cast(pa.int64(), safe=False))
    return (counts.to_numpy(zero_copy_only=False).astype(np.int64),
            suspects.to_numpy(zero_copy_only=False).astype(bool))


ORDER = {"count": 60, "length": 61, "seed": 62, "id": 63, COLUMN: 64}
"""Where each of its problems stands among a row's."""


def _check(batch: InputBatch) -> Checked:
    """The `num_outputs` column (its values, the ids and seeds they derive, the collisions found over the whole
    manifest): the jobs each row makes, and the problems."""
    values, ids, seeds = batch.raw.get(COLUMN), batch.strings["id"], batch.raw.get("seed")
    counts, suspects = output_counts(values, batch.size)
    checked = Checked(counts=counts)
    problems = checked.problems
    if suspects.any():
        offsets = np.flatnonzero(suspects)
        for offset, value in zip(offsets.tolist(), values.take(pa.array(offsets)).to_pylist(), strict=True):
            problems.append((offset, ORDER["count"], COLUMN, count_problem(value)))
    many = np.flatnonzero((counts > 1) & ~batch.bad_ids)
    if len(many):
        digits = np.char.str_len(counts[many].astype(str))  # the '-k' of the last output: 1 + digits of K-1
        lengths = pc.binary_length(ids.take(pa.array(many))).to_numpy(zero_copy_only=False)
        for offset in many[lengths + 1 + digits > MAX_ID_BYTES].tolist():
            problem = length_problem(ids[offset].as_py(), int(counts[offset]), MAX_ID_BYTES)
            if problem:
                problems.append((offset, ORDER["length"], "id", problem))
    many = np.flatnonzero(counts > 1)
    if len(many) and seeds is not None and seeds.type in (pa.int64(), pa.uint64()):  # narrower ones fit
        mine = seeds.take(pa.array(many))
        near = pc.fill_null(pc.greater(mine, pa.scalar(INT64_MAX - MAX_OUTPUTS, mine.type)), False)
        for index in np.flatnonzero(near.to_numpy(zero_copy_only=False)).tolist():
            seed, offset = mine[index].as_py(), int(many[index])
            problem = None if row_seed_problem(seed) else seed_problem(seed, int(counts[offset]))
            if problem:
                problems.append((offset, ORDER["seed"], "seed", problem))
    for row in range(batch.first_row, batch.first_row + batch.size) if batch.collisions else ():
        for column, reason in batch.collisions.get(row, ()):
            problems.append((row - batch.first_row, ORDER[column], column, reason))
    return checked


NUM_OUTPUTS = RowInput(
    name=COLUMN,
    columns=(Column(COLUMN, "count", False,
                    "jobs the row makes (ids <id>-0 to <id>-(K-1)); null or 1: one, its id"),),
    resolved=(),  # it makes jobs (`expand`): `id`, `source_id` and `seed` say which output each is
    check=_check,
)

