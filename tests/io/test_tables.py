from __future__ import annotations

import pyarrow as pa

from genbatch.io import tables


def test_types_are_inferred_per_column():
    table = tables.records_to_table([
        {"i": 1, "f": 1, "b": True, "s": "x", "l": [1, 2], "mixed": 1, "none": None},
        {"i": None, "f": 2.5, "b": False, "s": None, "l": [3], "mixed": "two"},
    ])
    types = {f.name: f.type for f in table.schema}
    assert types == {"i": pa.int64(), "f": pa.float64(), "b": pa.bool_(), "s": pa.string(), "l": pa.string(),
                     "mixed": pa.string(), "none": pa.string()}
    assert table.column("l").to_pylist() == ["[1, 2]", "[3]"]
    assert table.column("mixed").to_pylist() == ["1", "two"]


def test_flatten_nested_records():
    assert tables.flatten({"seconds": {"denoise": 2.0, "vae": {"decode": 1.0}}, "a": 1}) == {
        "seconds_denoise": 2.0, "seconds_vae_decode": 1.0, "a": 1}


def test_results_one_row_per_job_done_beats_failed_beats_rejected():
    table = tables.build_results(
        done={"a": {"seed": 1, "seconds": {"denoise": 3.0}, "extra": "e1", "row": 1}},
        failed={"a": {"error": "old", "row": 1}, "b": {"error": "boom", "seed": 2, "row": 0}},
        rejected=[{"id": "a", "row": 1, "column": "width", "reason": "dup"},
                  {"id": "c", "row": 2, "column": "prompt", "reason": "empty"}],
        extra_columns=["extra", "never_set"],
    )
    rows = table.to_pylist()
    assert [(r["id"], r["status"]) for r in rows] == [("b", "failed"), ("a", "done"), ("c", "rejected")]
    names = table.column_names
    assert names[:5] == ["id", "source_id", "status", "output_uri", "error"]
    assert names.index("seconds_denoise") < names.index("extra") < names.index("never_set")
    assert rows[1]["error"] is None and rows[0]["error"] == "boom"


def test_parts_with_different_optional_columns_concatenate():
    one = tables.timings_table([dict(run_id="r", job_id="j", rank=0, stage="s", start=0.0, seconds=1.0)])
    two = tables.timings_table([dict(run_id="r", job_id="j", rank=1, stage="s", step=3, start=0.0, seconds=1.0,
                                     peak_bytes=10)])
    both = tables.concat([tables.from_parquet_bytes(tables.to_parquet_bytes(t)) for t in (one, two)])
    assert both.num_rows == 2 and both.column("peak_bytes").to_pylist() == [None, 10]
    assert both.column("step").to_pylist() == [None, 3]
