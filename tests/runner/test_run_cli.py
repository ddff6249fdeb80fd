"""`gen run` end to end in one process: outputs, results, timings, rejected rows, failures, resume, status."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from genbatch.io import decode_mp4, decode_png
from genbatch.parallel.dims import ParallelDims
from tests.support.runs import run_cli as gen, write_manifest

ROWS = [
    {"id": "fox", "prompt": "a fox in snow", "model": "tiny-wan", "num_inference_steps": 3, "category": "animals"},
    {"id": "owl", "prompt": "an owl at night", "model": "tiny-flux", "num_inference_steps": 2, "category": "birds"},
    {"id": "bad-size", "prompt": "a tree", "model": "tiny-flux", "width": 60, "category": "plants"},
    {"id": "", "prompt": "no id", "category": "none"},
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    manifest = write_manifest(str(root / "m.parquet"), ROWS)
    out = root / "out"
    first = gen("run", manifest, "--out", str(out), "--model", "tiny-wan")  # for the row that names none
    second = gen("run", manifest, "--out", str(out), "--model", "tiny-wan")
    return manifest, out, first, second


def test_outputs_results_and_rejections(finished_run):
    manifest, out, first, _ = finished_run
    assert first.returncode == 1, first.stderr  # every valid row done; rejected rows are work not done
    video = decode_mp4((out / "outputs" / "fox.mp4").read_bytes())
    assert video.shape == (9, 48, 64, 3)  # the preset's default frames and size
    image = decode_png((out / "outputs" / "owl.png").read_bytes())
    assert image.shape == (64, 64, 3)
    results = {row["id"]: row for row in pq.read_table(out / "results" / "results.parquet").to_pylist()}
    assert results["fox"]["status"] == "done" and results["owl"]["status"] == "done"
    assert results["fox"]["category"] == "animals"  # extra columns carried through
    assert results["fox"]["output_uri"].endswith("outputs/fox.mp4")
    assert results["fox"]["denoise_s"] > 0 and results["fox"]["vae_decode_s"] > 0
    assert results["bad-size"]["status"] == "rejected"
    rejected = pq.read_table(out / "rejected" / "rejected.parquet").to_pylist()
    reasons = {(row["id"], row["column"]) for row in rejected}
    assert ("bad-size", "width") in reasons and (("", "id") in reasons or (None, "id") in reasons)
    # said at once, not only in the table: which rows will not run, why, and where the list is
    assert "genbatch: rejected row 2 (id 'bad-size'): column 'width'" in first.stderr
    assert f"2 rejected rows, each with its reason, in {out}/rejected/" in first.stderr


def test_every_denoising_step_is_timed(finished_run):
    _, out, _, _ = finished_run
    timings = pq.read_table(out / "timings").to_pylist()
    steps = {(row["job_id"], row["step"]) for row in timings if row["stage"] == "denoise_step"}
    assert steps == {("fox", 0), ("fox", 1), ("fox", 2), ("owl", 0), ("owl", 1)}
    stages = {row["stage"] for row in timings if row["job_id"] == "fox"}
    assert {"text_encode", "denoise_step", "vae_decode", "compress", "write"} <= stages
    assert all(row["seconds"] >= 0 and row["start"] > 1.7e9 for row in timings)
    assert {row["layout"] for row in timings} == {"single"}  # the layout's name (`ParallelDims.name`)


def test_run_info(finished_run):
    _, out, _, _ = finished_run
    info = json.loads((out / "run.json").read_text())
    assert info["versions"]["torch"] and info["host"] and info["ended"] >= info["started"]
    assert info["cpu_cores"] >= 1  # what a CPU calibration divides its ranks by
    assert info["summary"] == {"done": 2, "failed": 0, "rejected": 2}
    assert info["layout"] == "single" and ParallelDims.parse(info["layout"]) == ParallelDims()
    assert info["mesh"] == ParallelDims().describe() and info["options"]["pp"] == info["options"]["tp"] == 1


def test_rerun_skips_done_jobs(finished_run):
    _, out, _, second = finished_run
    assert second.returncode == 1, second.stderr  # the rejected rows are still rejected
    attempts = {row["run_id"] for row in pq.read_table(out / "timings").to_pylist()}
    assert len(attempts) == 1  # the second attempt generated nothing
    assert "2 skipped" in second.stderr


def test_status(finished_run):
    manifest, out, _, _ = finished_run
    status = gen("status", str(out), "--json")
    counts = json.loads(status.stdout)
    assert {key: counts.pop(key) for key in ("total", "done", "failed", "rejected", "pending")} == {
        "total": 4, "done": 2, "failed": 0, "rejected": 2, "pending": 0}
    assert counts["jobs_per_hour"] > 0 and counts["eta_s"] == 0  # from the timings; nothing left to wait for
    watched = gen("status", str(out), "--watch", "--interval", "0.01")  # nothing pending: one line, done
    assert watched.returncode == 0 and len(watched.stdout.splitlines()) == 1
    assert "pending: 0" in watched.stdout and "eta: 0s" in watched.stdout and "jobs/hour: " in watched.stdout


def test_a_failing_job_is_recorded_and_the_run_goes_on(tmp_path):
    rows = [
        {"id": "explodes", "prompt": "x", "model": "tiny-wan", "guidance_scale": 1e38, "num_inference_steps": 2},
        {"id": "fine", "prompt": "y", "model": "tiny-flux", "num_inference_steps": 2},
    ]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    result = gen("run", manifest, "--out", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    results = {row["id"]: row for row in pq.read_table(tmp_path / "out" / "results").to_pylist()}
    assert results["explodes"]["status"] == "failed"
    assert "NaN" in results["explodes"]["error"]
    assert results["fine"]["status"] == "done"


def test_a_job_that_keeps_failing_is_tried_in_at_most_max_attempts_runs(tmp_path):
    rows = [
        {"id": "explodes", "prompt": "x", "model": "tiny-wan", "guidance_scale": 1e38, "num_inference_steps": 2},
        {"id": "fine", "prompt": "y", "model": "tiny-flux", "num_inference_steps": 2},
    ]
    manifest, out = write_manifest(str(tmp_path / "m.parquet"), rows), tmp_path / "out"

    def attempt(*options):
        result = gen("run", manifest, "--out", str(out), "--max-attempts", "2", *options)
        failed = json.loads((out / "failed" / "explodes.json").read_text())
        return result, len(failed["failed_in"])  # a run that tries the job again fails it again: one more

    assert attempt()[1] == 1
    second, failed_runs = attempt()
    assert (second.returncode, failed_runs) == (1, 2), second.stderr  # retried
    third, failed_runs = attempt()
    assert (third.returncode, failed_runs) == (1, 2), third.stderr  # left alone, still counted failed
    assert "not trying again 1 job that failed in 2 or more runs: explodes (2 runs)" in third.stderr
    assert "--max-attempts" in third.stderr and "1 not tried again" in third.stderr
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert results["explodes"]["status"] == "failed" and results["explodes"]["failed_runs"] == 2
    assert results["fine"]["status"] == "done"
    fourth, failed_runs = attempt("--max-attempts", "3")  # raised: tried once more
    assert (fourth.returncode, failed_runs) == (1, 3), fourth.stderr


def test_file_level_manifest_errors_exit_2(tmp_path):
    bad = tmp_path / "not.parquet"
    bad.write_text("id,prompt\n1,a\n")
    result = gen("run", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Parquet" in result.stderr


def test_bad_layout_exits_2(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS[:1])
    result = gen("run", manifest, "--out", str(tmp_path / "out"), "--ulysses", "3")
    assert result.returncode == 2
    assert "ulysses" in result.stderr.lower()


def test_an_out_of_memory_job_fails_naming_the_fix_and_the_run_goes_on(tmp_path, monkeypatch):
    """An allocator failure inside one job (injected into the transformer call of that job only): the job is
    failed with the error and what to change, the next job runs."""
    import torch

    from genbatch.models.wan import WanHooks

    real_predict = WanHooks.predict

    def predict(self, pipe, trajectory, latents, t, step, branch):
        if latents.shape[-1] * latents.shape[-2] > 64:  # only the big job's latents
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_predict(self, pipe, trajectory, latents, t, step, branch)

    monkeypatch.setattr(WanHooks, "predict", predict)
    rows = [
        {"id": "too-big", "prompt": "x", "model": "tiny-wan", "width": 128, "height": 128, "num_inference_steps": 2},
        {"id": "fits", "prompt": "y", "model": "tiny-wan", "width": 32, "height": 32, "num_inference_steps": 2},
    ]
    result = gen("run", write_manifest(str(tmp_path / "m.parquet"), rows), "--out", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    results = {row["id"]: row for row in pq.read_table(tmp_path / "out" / "results").to_pylist()}
    assert results["fits"]["status"] == "done"
    assert results["too-big"]["status"] == "failed"
    error = results["too-big"]["error"]
    assert error.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB")
    assert "--fsdp" in error and "--ulysses" in error and "gen plan" in error
