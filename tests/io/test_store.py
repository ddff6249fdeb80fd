"""RunStore semantics, identical on a local folder, memory://, moto_server and Ceph RGW."""

from __future__ import annotations

import hashlib
import threading

import pytest

from genbatch.io import RunStore


def _store(target, **kwargs) -> RunStore:
    return RunStore(target.url, target.storage_options, **kwargs)


def test_commit_then_done(run_target):
    store = _store(run_target)
    media = b"\x89PNG fake" * 50
    result = store.commit("cat/1 a", media, "png", {"seed": 7, "width": 64, "tag": "x", "row": 0})
    assert not result.already_done and result.bytes_written == len(media)
    assert result.output_uri == store.output_uri("cat/1 a", "png")
    assert result.output_uri.endswith("/outputs/cat%2F1%20a.png")
    assert store.done_ids() == {"cat/1 a"}
    done = store.read_done("cat/1 a")
    assert done["seed"] == 7 and done["tag"] == "x" and done["output_uri"] == result.output_uri
    assert done["output_sha256"] == hashlib.sha256(media).hexdigest()
    with store.fs.open(store.layout.output("cat/1 a", "png"), "rb") as handle:
        assert handle.read() == media
    assert store.read_done("missing") is None


def test_second_commit_changes_nothing(run_target):
    store = _store(run_target)
    first = store.commit("job", b"first output", "mp4", {"seed": 1})
    again = _store(run_target).commit("job", b"a different output", "mp4", {"seed": 2})
    assert not first.already_done and again.already_done and again.bytes_written == 0
    assert again.output_uri == first.output_uri
    assert store.fs.cat_file(store.layout.output("job", "mp4")) == b"first output"
    assert store.read_done("job")["seed"] == 1


def test_racing_commits_one_winner(run_target):
    """Threads committing the same job at once: exactly one reports the commit as its own."""
    store = _store(run_target)
    results, barrier = [], threading.Barrier(4)

    def commit(i):
        barrier.wait()
        results.append(store.commit("raced", b"same bytes", "png", {"writer": i}))

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.already_done for r in results) == [False, True, True, True]
    winner = next(r for r in results if not r.already_done)
    assert store.read_done("raced")["output_uri"] == winner.output_uri


def test_done_ids_is_one_listing_of_many(run_target):
    store = _store(run_target)
    ids = {f"job-{i:03d}" for i in range(40)}
    for job_id in ids:
        store.commit(job_id, job_id.encode(), "png", {})
    store.record_failure("job-999", {"error": "x"})
    assert _store(run_target).done_ids() == ids
    assert store.failed_ids() == {"job-999"}


def test_failures_results_and_status(run_target):
    store = _store(run_target)
    store.commit("a", b"A", "png", {"seed": 1, "model": "tiny-flux", "seconds": {"denoise": 1.5}, "lang": "en",
                                    "row": 0})
    store.record_failure("b", {"error": "first failure", "lang": "fr", "row": 1})
    store.record_failure("b", {"error": "latest failure", "lang": "fr", "row": 1})
    store.record_failure("a", {"error": "an older failure of a job done since", "row": 0})
    store.write_rejected([
        {"id": "c", "row": 2, "column": "prompt", "reason": "empty prompt"},
        {"id": "c", "row": 2, "column": "width", "reason": "not a multiple of 16"},
        {"id": None, "row": 3, "column": "id", "reason": "missing id"},
    ])
    uri = store.write_results(extra_columns=["lang"])
    assert uri.endswith("/results/results.parquet")
    table = store.read_results()
    rows = table.to_pylist()
    assert [r["status"] for r in rows] == ["done", "failed", "rejected", "rejected"]
    assert [r["id"] for r in rows] == ["a", "b", "c", None]
    assert rows[0]["output_uri"] == store.output_uri("a", "png") and rows[0]["error"] is None
    assert rows[0]["seconds_denoise"] == 1.5 and rows[0]["lang"] == "en"
    assert rows[1]["error"] == "latest failure" and rows[1]["lang"] == "fr"
    assert rows[2]["error"] == "prompt: empty prompt; width: not a multiple of 16"
    assert table.schema.field("seed").type == "int64" and table.schema.field("lang").type == "string"
    assert store.status_counts(["a", "b", "d", "e"]) == {"done": 1, "failed": 1, "rejected": 2, "pending": 2}


def test_failures_count_the_run_attempts_they_happened_in(run_target):
    first = _store(run_target, attempt="run-1")
    first.record_failure("b", {"error": "boom", "row": 1})
    _store(run_target, rank=1, attempt="run-1").record_failure("b", {"error": "boom", "row": 1})  # its peer
    first.record_failure("c", {"error": "other", "row": 2})
    assert first.failed_runs() == {"b": 1, "c": 1}, "two ranks of one attempt are one failed run"
    second = _store(run_target, attempt="run-2")
    second.record_failure("b", {"error": "boom again", "row": 1})
    assert second.failed_runs() == {"b": 2, "c": 1}
    second.fs.pipe_file(second.layout.failed("c"), b"{not json")  # a torn record is replaced, not fatal
    second.record_failure("c", {"error": "other", "row": 2})
    assert second.failed_runs() == {"b": 2, "c": 1}
    second.write_results()
    rows = {row["id"]: row for row in second.read_results().to_pylist()}
    assert rows["b"]["failed_runs"] == 2 and rows["b"]["error"] == "boom again" and rows["b"]["attempt"] == "run-2"


def test_timings_parts_never_collide(run_target):
    rank0, rank1 = _store(run_target, rank=0), _store(run_target, rank=1)
    rerun = _store(run_target, rank=0)  # a later attempt of rank 0
    row = dict(run_id="r", job_id="j", stage="denoise_step", start=100.0, seconds=0.25)
    for store in (rank0, rank1, rerun):
        for step in range(3):
            store.append_timings([{**row, "rank": store.rank, "step": step}])
        store.flush_timings()
    rank1.append_timings([{**row, "rank": 1, "stage": "write", "step": None, "bytes_all_to_all": 4096}])
    rank1.flush_timings()
    assert rank0.flush_timings() is None  # nothing buffered: no empty part
    table = rank0.read_timings()
    assert table.num_rows == 10
    parts = [n for n in rank0.objects.list_names(rank0.layout.join("timings"))]
    assert len(parts) == 4 and len(set(parts)) == 4
    assert table.schema.field("step").type == "int32"
    assert sorted(table.column("bytes_all_to_all").drop_null().to_pylist()) == [4096]
    with pytest.raises(ValueError, match="lacks"):
        rank0.append_timings([{"job_id": "j"}])


def test_checkpoints(run_target):
    store = _store(run_target)
    assert store.load_checkpoint("j") is None
    store.save_checkpoint("j", b"step 4")
    store.save_checkpoint("j", b"step 8")
    assert store.load_checkpoint("j") == b"step 8"
    store.delete_checkpoint("j")
    store.delete_checkpoint("j")  # deleting twice is fine
    assert store.load_checkpoint("j") is None


def test_run_info(run_target):
    first, second = _store(run_target), _store(run_target)
    first.write_run_info({"model": "tiny-wan", "world_size": 2})
    second.write_run_info({"model": "tiny-wan", "world_size": 4})
    info = first.read_run_info()
    assert info["world_size"] == 4 and info["attempt"] == second.attempt
    attempts = first.objects.list_names(first.layout.join("attempts"))
    assert attempts == sorted([f"{first.attempt}.json", f"{second.attempt}.json"])


def test_bad_ids_and_extensions(run_target):
    store = _store(run_target)
    with pytest.raises(ValueError, match="non-empty"):
        store.output_uri("", "png")
    with pytest.raises(ValueError, match="extension"):
        store.output_uri("a", "../png")
    store.commit(".hidden", b"h", "png", {})
    assert store.done_ids() == {".hidden"}


def test_recover_clears_checkpoints_of_done_jobs(run_target):
    store = _store(run_target)
    store.save_checkpoint("done-job", b"c1")
    store.commit("done-job", b"m", "png", {})  # killed before delete_checkpoint
    store.save_checkpoint("running-job", b"c2")
    counts = _store(run_target).recover()
    assert counts["removed_checkpoints"] == 1
    assert store.load_checkpoint("done-job") is None and store.load_checkpoint("running-job") == b"c2"


def test_record_that_is_not_json_fails_before_any_write(run_target):
    store = _store(run_target)
    with pytest.raises(TypeError, match="not JSON-able"):
        store.commit("j", b"media", "png", {"bad": object()})
    assert store.objects.list_names(store.layout.join("outputs")) == [] and store.done_ids() == set()
