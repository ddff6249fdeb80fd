"""The job ids of a whole manifest, column-wise: which rows take an id an earlier row's jobs already have.

With `num_outputs`, a row's job ids are `<id>-0` to `<id>-(K-1)` (`genbatch.jobs.inputs.num_outputs`). They share one
namespace with every row's own id, first use first: a later row whose own id an earlier row derives, or which
derives an earlier row's own id, is rejected naming the id and the earlier row. An id two rows both have as
their own, or both derive (then their own ids are equal too), is the duplicate rule's (`columns.first_uses`).

Every entry (each usable row's id, then the ids it derives) is one string in an Arrow array sorted once, as
`first_uses` does for the ids alone; a manifest without a count above 1 builds nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from genbatch.jobs.inputs import num_outputs as outputs
from genbatch.manifests.columns import first_uses, id_problems


def _strings(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    return ids.cast(pa.string())


def collisions(ids: pa.Array | pa.ChunkedArray, counts: np.ndarray) -> dict[int, list[tuple[str, str]]]:
    """Row -> its (column, reason) collisions: `id` when its own id is an earlier row's derived id,
    `num_outputs` (once per row, the first id named, how many more said) when it derives earlier rows' ids.
    `counts`: the jobs each row makes (`outputs.output_counts`). Rows whose own id is unusable take no part."""
    counts = np.asarray(counts, np.int64)
    if not (counts > 1).any():
        return {}
    ids = _strings(ids)
    usable = np.ones(len(ids), dtype=bool)
    usable[list(id_problems(ids))] = False
    many = np.flatnonzero(usable & (counts > 1))
    if not len(many):
        return {}
    own = np.flatnonzero(usable)
    local, k = outputs.output_index(counts[many])
    derived_rows = many[local]
    derived = outputs.derived_ids(ids.take(pa.array(derived_rows)), k)
    entry_row = np.concatenate([own, derived_rows])
    entry_k = np.concatenate([np.full(len(own), -1, np.int64), k])  # -1: the row's own id
    order = np.lexsort((entry_k, entry_row))  # manifest order: each row's own id, then its outputs
    names = pa.concat_arrays([ids.take(pa.array(own)), derived]).take(pa.array(order))
    rows, ks = entry_row[order], entry_k[order]
    later, first = first_uses(names)
    found: dict[int, list[tuple[str, str]]] = {}
    taken: dict[int, list[tuple[int, int]]] = {}  # row -> (its entry, the earlier entry) for its derived ids
    for position, earlier in zip(later.tolist(), first.tolist(), strict=True):
        row, own, earlier_own = int(rows[position]), ks[position] < 0, ks[earlier] < 0
        if own and not earlier_own:
            found.setdefault(row, []).append(("id", outputs.id_collision(names[position].as_py(),
                                                                          int(rows[earlier]))))
        elif earlier_own and not own:
            taken.setdefault(row, []).append((position, earlier))
        # own against own, derived against derived: a duplicate id, said by the duplicate rule
    for row, pairs in taken.items():
        position, earlier = pairs[0]
        reason = outputs.outputs_collision(int(counts[row]), names[position].as_py(), int(rows[earlier]),
                                           len(pairs) - 1)
        found.setdefault(row, []).append((outputs.COLUMN, reason))
    return found
