"""The order jobs are handed out in, and the share of a manifest an array task takes.

Pure functions of the job list: every rank computes the same order from the same jobs. `hand_out_order`
and `select_share` take `JobSpec`s; `hand_out_positions` and `share_positions` give the same orders for a
`JobTable` as positions, from its columns (a million jobs are ordered without building one `JobSpec`).
Each takes `spec_of`, which resolves a model name to its `ModelSpec` (`genbatch.models.resolve_model`); it
is called once per distinct model, never per job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Callable, Sequence

import numpy as np

from genbatch.jobs.cost import estimated_flops, estimated_flops_array
from genbatch.jobs.spec import JobSpec
from genbatch.jobs.table import JobTable

if TYPE_CHECKING:
    from genbatch.models.spec import ModelSpec  # a parameter's type: jobs sit below models

SpecOf = Callable[[str], "ModelSpec"]
"""Resolves a model name to its spec (`genbatch.models.resolve_model`)."""


def hand_out_order(jobs: Sequence[JobSpec], spec_of: SpecOf) -> list[JobSpec]:
    """Largest estimated cost first (longest-processing-time order), grouped by model so that each
    group loads each model once, and within a model by adapter set so that each group switches adapters
    rarely; ties broken by manifest row, so the order is deterministic."""
    first_row: dict[str, int] = {}
    first_set_row: dict[tuple, int] = {}
    for job in jobs:
        first_row.setdefault(job.model, job.row)
        first_set_row.setdefault((job.model, job.lora), job.row)
    specs = {name: spec_of(name) for name in first_row}
    return sorted(jobs, key=lambda job: (first_row[job.model], first_set_row[(job.model, job.lora)],
                                         -estimated_flops(job, specs[job.model]), job.row))


def select_share(jobs: Sequence[JobSpec], index: int, count: int, spec_of: SpecOf) -> list[JobSpec]:
    """Share `index` of `count` (0-based): every count-th job of the cost order, so shares get similar
    work. Which share a job belongs to depends only on the manifest, never on what is already done."""
    _check_share(index, count)
    return hand_out_order(jobs, spec_of)[index::count]


def _check_share(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"share {index}/{count} is out of range: use 0 <= index < count, e.g. --share 0/{max(count, 1)}")


_KEY_ROWS = 65_536
"""Rows whose order keys are computed at a time."""


class OrderKeys:
    """What the hand-out order sorts a `JobTable`'s jobs by, one NumPy entry per job: model, adapter set,
    cost, row."""

    __slots__ = ("model", "models", "adapters", "adapter_sets", "flops", "row")

    def __init__(self, jobs: JobTable, spec_of: SpecOf) -> None:
        import pyarrow.compute as pc

        table = jobs.table
        codes: dict[str, int] = {}
        specs: dict[str, ModelSpec] = {}
        model = np.zeros(table.num_rows, dtype=np.int64)
        sets: dict[object, int] = {}
        adapters = np.zeros(table.num_rows, dtype=np.int64)
        flops = np.zeros(table.num_rows, dtype=np.float64)
        for start in range(0, table.num_rows, _KEY_ROWS):  # a piece at a time: temporaries stay small
            piece = table.slice(start, _KEY_ROWS)
            encoded = pc.dictionary_encode(piece.column("model").combine_chunks())
            known = np.array([codes.setdefault(name, len(codes)) for name in encoded.dictionary.to_pylist()], np.int64)
            local = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            model[start : start + piece.num_rows] = known[local]
            loras = pc.dictionary_encode(piece.column("lora").combine_chunks(), null_encoding="encode")
            set_codes = np.array([sets.setdefault(text, len(sets)) for text in loras.dictionary.to_pylist()], np.int64)
            adapters[start : start + piece.num_rows] = set_codes[loras.indices.to_numpy(zero_copy_only=False)]
            numbers = {name: piece.column(name).fill_null(fill).to_numpy() for name, fill in (
                ("width", 0), ("height", 0), ("num_frames", 1), ("num_inference_steps", 0), ("guidance_scale", 0.0))}
            has_negative = pc.is_valid(piece.column("negative_prompt")).to_numpy(zero_copy_only=False)
            for code, name in enumerate(encoded.dictionary.to_pylist()):
                mine = local == code
                if name not in specs:
                    specs[name] = spec_of(name)
                flops[start : start + piece.num_rows][mine] = estimated_flops_array(
                    specs[name], numbers["width"][mine], numbers["height"][mine],
                    numbers["num_frames"][mine], numbers["num_inference_steps"][mine], numbers["guidance_scale"][mine],
                    has_negative[mine],
                )
        order = jobs.order
        whole = len(order) == table.num_rows and jobs.table is table and np.array_equal(order, np.arange(len(order)))
        self.model = model if whole else model[order]
        """Each job's model, as an index into `models`."""
        self.models: list[str] = list(codes)
        """The distinct models."""
        self.adapters = adapters if whole else adapters[order]
        """Each job's adapter set (its `lora` text), as an index into `adapter_sets`."""
        self.adapter_sets: list[str | None] = list(sets)
        """The distinct adapter sets (None: no adapter)."""
        self.row = jobs.numbers("row")
        """Each job's manifest row."""
        self.flops = flops if whole else flops[order]
        """Each job's `estimated_flops`."""

    def order(self, positions: np.ndarray) -> np.ndarray:
        """`positions` in hand-out order (as `hand_out_order` sorts those jobs)."""
        models, rows = self.model[positions], self.row[positions]
        # each model ranks by the row of its first job in the given order (as hand_out_order's setdefault),
        # and so does each (model, adapter set) within it
        present, first = np.unique(models, return_index=True)
        first_row = np.zeros(len(self.models), dtype=np.int64)
        first_row[present] = rows[first]
        pairs = models * max(len(self.adapter_sets), 1) + self.adapters[positions]
        _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
        pair_row = rows[first][inverse.reshape(-1)]
        return positions[np.lexsort((rows, -self.flops[positions], pair_row, first_row[models]))]


def hand_out_positions(keys: OrderKeys, positions: np.ndarray | None = None) -> np.ndarray:
    """The jobs at `positions` (default: all) in hand-out order: `hand_out_order` as positions."""
    return keys.order(np.arange(len(keys.row), dtype=np.int64) if positions is None else positions)


def share_positions(keys: OrderKeys, index: int, count: int) -> np.ndarray:
    """`select_share` as positions: every count-th job of the whole table's hand-out order."""
    _check_share(index, count)
    return hand_out_positions(keys)[index::count]


def parse_share(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--share {text!r} is not K/N (e.g. --share 0/4 for the first of four shares)") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--share {text!r}: need 0 <= K < N")
    return index, count
