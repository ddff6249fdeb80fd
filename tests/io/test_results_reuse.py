"""results.parquet is consolidated incrementally: the rows of jobs it already lists as done are kept (a done
marker never changes), so only newer markers are read; a marker that is gone takes its row with it."""

from __future__ import annotations

from genbatch.io import RunStore


def _rows(store):
    return {row["id"]: row for row in store.read_results().to_pylist()}


def test_done_rows_are_kept_and_only_new_markers_are_read(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    for row, job_id in enumerate(("a", "b", "c")):
        store.commit(job_id, b"png", "png", {"seed": row, "row": row, "lang": "en", "seconds": {"denoise": 1.0}})
    store.record_failure("d", {"error": "boom", "row": 3})
    store.write_results(extra_columns=["lang"])
    first = _rows(store)

    # a marker already consolidated is not read again: damaging it changes nothing
    (tmp_path / "run" / "done" / "a.json").write_text("not json")
    store.commit("d", b"png", "png", {"seed": 3, "row": 3, "lang": "fr", "seconds": {"denoise": 2.0}})
    (tmp_path / "run" / "done" / "c.json").unlink()  # no longer done: its row goes
    store.write_results(extra_columns=["lang"])
    second = _rows(store)
    assert second["a"] == first["a"] and second["b"] == first["b"]
    assert "c" not in second
    assert second["d"]["status"] == "done" and second["d"]["lang"] == "fr" and second["d"]["seconds_denoise"] == 2.0
    assert [row["id"] for row in store.read_results().to_pylist()] == ["a", "b", "d"]


def test_a_listing_just_made_is_not_made_again(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    for row, job_id in enumerate(("a", "b")):
        store.commit(job_id, b"png", "png", {"seed": row, "row": row})
    store.write_results(done_ids={"a"})  # what the caller's listing gave: b is left for the next consolidation
    assert [row["id"] for row in store.read_results().to_pylist()] == ["a"]
    store.write_results()
    assert [row["id"] for row in store.read_results().to_pylist()] == ["a", "b"]
