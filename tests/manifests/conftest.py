"""Helpers for manifest tests: write a manifest from columns, with explicit Arrow types where needed."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Arrow types of the v1 columns when a test gives plain Python lists (nulls keep the type).
TYPES = {
    "id": pa.string(),
    "prompt": pa.string(),
    "negative_prompt": pa.string(),
    "model": pa.string(),
    "width": pa.int64(),
    "height": pa.int64(),
    "num_frames": pa.int64(),
    "num_inference_steps": pa.int64(),
    "guidance_scale": pa.float64(),
    "seed": pa.int64(),
    "fps": pa.int64(),
}


def manifest_table(**columns) -> pa.Table:
    """A table from column lists (or Arrow arrays); v1 columns get their usual types."""
    arrays = {
        name: values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, type=TYPES.get(name))
        for name, values in columns.items()
    }
    return pa.table(arrays)


@pytest.fixture
def write_manifest(tmp_path):
    """write_manifest(**columns) -> path of a Parquet file holding those columns."""
    counter = iter(range(1000))

    def write(**columns) -> str:
        path = tmp_path / f"manifest-{next(counter)}.parquet"
        pq.write_table(manifest_table(**columns), path)
        return str(path)

    return write
