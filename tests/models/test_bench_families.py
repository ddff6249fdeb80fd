"""`gen bench` runs the Qwen-Image and HunyuanVideo suites: the preset saved to the model cache, its suite's
manifest run, every step of every job timed, a report written."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from genbatch.benchmark.suites import get_suite
from tests.support.runs import run_cli


@pytest.mark.parametrize("suite_name", [  # the video family's suite in make test-slow; the tiny suite's video in make test
    "tiny-qwen-image", pytest.param("tiny-hunyuan-video", marks=pytest.mark.slow)])
def test_gen_bench_runs_the_family_suite(suite_name, tmp_path):
    suite = get_suite(suite_name)
    out = str(tmp_path / "report")
    result = run_cli("bench", "--suite", suite_name, "--out", out, "--model-cache", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert list(summary["layouts"]) == ["single"] and summary["failed_layouts"] == []
    assert summary["layouts"]["single"]["jobs"] == suite.jobs
    timings = pq.read_table(os.path.join(out, "timings.parquet")).to_pylist()
    steps = {(row["job_id"], row["step"]) for row in timings if row["stage"] == "denoise_step"}
    assert len(steps) == suite.jobs * suite.num_inference_steps
    assert os.path.isfile(os.path.join(out, "report.md"))
