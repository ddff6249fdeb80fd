"""`gen run` with step caching end to end in one process: the manifest's `cache` column overrides `--cache`
per row, a bad value rejects that row alone, a row asking TeaCache of a model without published coefficients
fails alone (naming the covered models), the results row names the mode used and the skipped forwards, and
every step row of the timings carries its skipped count."""

from __future__ import annotations

import pyarrow.parquet as pq

from tests.support.runs import run_cli, write_manifest


def test_the_cache_column_overrides_the_run_and_lands_in_results_and_timings(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "skips", "prompt": "a fox in snow", "cache": "FBC:0.50", "num_inference_steps": 4},
        {"id": "run-level", "prompt": "an owl at night", "cache": None, "num_inference_steps": 4},
        {"id": "bad", "prompt": "a tree", "cache": "teacache:x"},
        {"id": "uncovered", "prompt": "a boat", "cache": "teacache:0.2", "num_inference_steps": 2},
    ])
    out = tmp_path / "out"
    result = run_cli("run", manifest, "--out", str(out), "--model", "tiny-wan", "--cache", "taylorseer:1")
    assert result.returncode == 1, result.stderr  # the uncovered row failed; the others ran
    assert "genbatch: rejected row 2 (id 'bad'): column 'cache'" in result.stderr
    results = {row["id"]: row for row in pq.read_table(out / "results" / "results.parquet").to_pylist()}
    assert results["skips"]["cache"] == "fbc:0.5" and results["skips"]["cache_skipped"] > 0
    assert results["run-level"]["cache"] == "taylorseer:1" and results["run-level"]["cache_skipped"] == 0
    assert results["bad"]["status"] == "rejected"
    assert results["uncovered"]["status"] == "failed" and "TeaCache covers Wan 2.1 T2V 1.3B" in results["uncovered"]["error"]
    steps = [row for row in pq.read_table(out / "timings").to_pylist() if row["stage"] == "denoise_step"]
    by_job = {job: [row["cache_skipped"] for row in sorted(steps, key=lambda r: r["step"]) if row["job_id"] == job]
              for job in ("skips", "run-level")}
    assert by_job["run-level"] == [0, 0, 0, 0]
    assert by_job["skips"][0] == 0 and sum(by_job["skips"]) == results["skips"]["cache_skipped"]
