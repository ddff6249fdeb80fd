"""Jobs as one Arrow table: the resolved columns of every valid row, a `JobSpec` built only when asked for.

A manifest of a million rows is a million jobs, but a rank only ever runs the few it is handed. The table
holds the resolved columns (`COLUMNS`, then the manifest's extra columns) once, in manifest order; a
`JobTable` is that table seen through an order (positions into it), so ordering, choosing a share and
leaving out the done jobs move integers, never rows. `jobs[i]` builds the i-th `JobSpec` on demand.

The table crosses processes as Arrow IPC streams of `IPC_ROWS` rows each (`ipc_piece` / `from_ipc`), read
back without a copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from genbatch.jobs.inputs import ROW_INPUTS
from genbatch.jobs.seeds import job_seed
from genbatch.jobs.spec import SETTINGS, JobSpec

_ROW = ("id", "source_id", "prompt", "negative_prompt", "model", *SETTINGS)
_INPUTS = tuple(name for row_input in ROW_INPUTS for name, _ in row_input.resolved)
COLUMNS = (*_ROW, *_INPUTS, "seed", "row")
"""The resolved columns, before the extra ones: the row's own, then each per-row input's (`genbatch.jobs.inputs`:
`cache`, the absolute URLs of `image` and `last_image`, the adapters' canonical text `lora`), then `seed` and
`row`. `source_id` is the manifest row's id (equal to `id` but for the jobs of a row with `num_outputs` > 1, whose
ids are `<source_id>-k`); `seed` is the job's own (the row's, plus k for output k; null: derived from `id` when
the job is built); `num_frames` and `fps` are null for image models."""
_TYPES = {"guidance_scale": pa.float64(), **{name: kind for row_input in ROW_INPUTS
                                             for name, kind in row_input.resolved}}
_STRINGS = ("id", "source_id", "prompt", "negative_prompt", "model")

_ITER_ROWS = 4096
"""Rows turned into Python objects at a time when iterating."""
IPC_ROWS = 65_536
"""Rows per piece of the table sent between processes (about 10 MB for short prompts)."""


class JobTable(Sequence[JobSpec]):
    """Jobs in some order over one table of resolved columns; `len`, indexing and iteration give `JobSpec`s."""

    __slots__ = ("_table", "_order", "_whole", "extra_columns")

    def __init__(self, table: pa.Table, order: np.ndarray | None = None) -> None:
        missing = [name for name in COLUMNS if name not in table.column_names]
        if missing:
            raise ValueError(f"a job table needs the columns {', '.join(missing)}; build it with read_jobs")
        self._table = table
        self._order = np.arange(table.num_rows, dtype=np.int64) if order is None else np.asarray(order, np.int64)
        self._whole = order is None  # every row in table order: columns need no reordering copy
        self.extra_columns: tuple[str, ...] = tuple(name for name in table.column_names if name not in COLUMNS)
        """The manifest's extra columns, in file order (each job's `extra` has exactly these keys)."""

    @classmethod
    def empty(cls, extra_schema: pa.Schema | None = None) -> JobTable:
        """No jobs (with these extra columns)."""
        fields = [pa.field(name, _TYPES.get(name, pa.string() if name in _STRINGS else pa.int64()))
                  for name in COLUMNS]
        return cls(pa.schema([*fields, *(extra_schema or [])]).empty_table())

    @property
    def table(self) -> pa.Table:
        """The underlying table, in manifest order (all rows, whatever this view's order)."""
        return self._table

    @property
    def order(self) -> np.ndarray:
        """The positions in `table` of this view's jobs, in this view's order."""
        return self._order

    def __len__(self) -> int:
        return len(self._order)

    def _spec(self, values: dict) -> JobSpec:
        extra = {name: values[name] for name in self.extra_columns}
        inputs = {}
        for row_input in ROW_INPUTS:
            inputs.update(row_input.job_fields(values))
        return JobSpec(
            id=values["id"], prompt=values["prompt"], negative_prompt=values["negative_prompt"],
            model=values["model"], width=values["width"], height=values["height"], num_frames=values["num_frames"],
            num_inference_steps=values["num_inference_steps"], guidance_scale=values["guidance_scale"],
            seed=job_seed(values["seed"], values["id"]), fps=values["fps"], **inputs, extra=extra,
            row=values["row"], source_id=None if values["source_id"] == values["id"] else values["source_id"],
        )

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        if not -len(self) <= index < len(self):
            raise IndexError(f"job {index} of {len(self)}")
        return self._spec(self._table.slice(int(self._order[index]), 1).to_pylist()[0])

    def __iter__(self) -> Iterator[JobSpec]:
        for start in range(0, len(self), _ITER_ROWS):
            for values in self._table.take(self._order[start : start + _ITER_ROWS]).to_pylist():
                yield self._spec(values)

    def take(self, positions: Sequence[int] | np.ndarray) -> JobTable:
        """The jobs at these positions of this view, in that order (no rows are copied)."""
        return JobTable(self._table, self._order[np.asarray(positions, dtype=np.int64)])

    def where(self, keep: np.ndarray) -> JobTable:
        """The jobs whose entry in the boolean array `keep` (one per job of this view) is true, in order."""
        return JobTable(self._table, self._order[np.asarray(keep, dtype=bool)])

    def column(self, name: str) -> pa.ChunkedArray:
        """One column for this view's jobs, in this view's order."""
        if self._whole:
            return self._table.column(name)
        return self._table.column(name).take(self._order)

    def numbers(self, name: str, fill=0) -> np.ndarray:
        """A numeric column for this view's jobs as a NumPy array, nulls replaced by `fill`."""
        column = self._table.column(name).fill_null(fill).to_numpy()
        return column if self._whole else column[self._order]

    def models(self) -> list[str]:
        """The distinct models of these jobs, sorted."""
        import pyarrow.compute as pc

        return sorted(pc.unique(self.column("model")).to_pylist())

    # ---- between processes, a piece at a time -------------------------------------------------------
    def ipc_pieces(self) -> int:
        """How many pieces `ipc_piece` cuts the underlying table into (at least one)."""
        return max(1, -(-self._table.num_rows // IPC_ROWS))

    def ipc_piece(self, index: int) -> pa.Buffer:
        """Piece `index` of the underlying table (`IPC_ROWS` rows) as one Arrow IPC stream; the order travels
        separately (`order`). Sent piece by piece, the table is never copied whole."""
        piece = self._table.slice(index * IPC_ROWS, IPC_ROWS).unify_dictionaries()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, piece.schema) as writer:
            writer.write_table(piece)
        return sink.getvalue()

    @classmethod
    def from_ipc(cls, pieces: Sequence, order: np.ndarray) -> JobTable:
        """The table of the `ipc_piece`s (anything with the buffer protocol), read in place, in `order`."""
        batches = [batch for piece in pieces for batch in pa.ipc.open_stream(pa.py_buffer(piece))]
        schema = pa.ipc.open_stream(pa.py_buffer(pieces[0])).schema
        return cls(pa.Table.from_batches(batches, schema=schema), order)
