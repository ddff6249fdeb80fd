"""`gen bench` on the command line: help, usage errors, and the exit status against a baseline."""

from __future__ import annotations

import os

import pytest

from genbatch.benchmark.nightly import REGRESSION
from genbatch.jobs.exit_codes import JOBS_FAILED, OK, USAGE
from tests.benchmark.conftest import scaled_copy
from tests.support.runs import run_cli


def test_help_names_suites_layouts_report_and_exit_codes():
    result = run_cli("bench", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for needle in ("--suite [tiny|cpu|gpu|tiny-qwen-image|tiny-hunyuan-video|flux|tiny-flux]", "--baseline URL", "--threshold", "--layouts NAMES", "OUT/report.md",
                   "3 a regression beyond --threshold", "efficiency against one rank"):
        assert needle in text, needle
    assert "bench     Run a benchmark suite over parallel layouts; report to OUT." in run_cli("--help").stdout


def test_usage_errors_exit_2_before_running(tmp_path):
    bad_layout = run_cli("bench", "--suite", "tiny", "--out", str(tmp_path / "a"), "--layouts", "single,dp2x")
    assert bad_layout.returncode == USAGE
    assert "cannot read 'dp2x'" in bad_layout.stderr and "cfg2-ulysses2" in bad_layout.stderr
    assert not os.path.exists(tmp_path / "a")
    no_baseline = run_cli("bench", "--suite", "tiny", "--out", str(tmp_path / "b"), "--baseline", str(tmp_path))
    assert no_baseline.returncode == USAGE and "has no timings.parquet" in no_baseline.stderr
    gpu_here = run_cli("bench", "--suite", "gpu", "--out", str(tmp_path / "c"))
    assert gpu_here.returncode == USAGE and "use --suite cpu" in gpu_here.stderr


def test_existing_report_is_kept_without_overwrite(tiny_report):
    result = run_cli("bench", "--suite", "tiny", "--out", tiny_report.out, "--layouts", "single")
    assert result.returncode == USAGE
    assert "already holds a report" in result.stderr and "--overwrite" in result.stderr


@pytest.mark.slow  # two more nights: test_compare.py holds the verdicts on the same report in make test
def test_exit_status_against_baselines(tiny_report, tmp_path):
    """A baseline 1000x faster than the run it was made from: exit 3 and the comparison in the report; one
    1000x slower: exit 0. (Tiny steps take milliseconds, so a loaded machine can slow a run 20x: the
    factors leave the verdict nothing to do with the machine's load.)"""
    fast = scaled_copy(tiny_report.out, str(tmp_path / "fast"), factor=0.001)
    out = str(tmp_path / "tonight")
    result = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", out, "--baseline", fast,
                     "--model-cache", tiny_report.model_cache)
    assert result.returncode == REGRESSION, result.stderr
    assert "REGRESSION" in result.stderr and "verdict:" in result.stderr
    with open(os.path.join(out, "report.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert "## Against the baseline" in text and "REGRESSION" in text
    assert "Not run tonight: ulysses2." in text  # --layouts single: the baseline's other layout is listed

    slow = scaled_copy(tiny_report.out, str(tmp_path / "slow"), factor=1000.0)
    again = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", str(tmp_path / "next"),
                    "--baseline", slow, "--threshold", "0.05", "--model-cache", tiny_report.model_cache)
    assert again.returncode == OK, again.stderr
    assert "verdict: no regression" in again.stderr


@pytest.mark.slow  # a third night of gen bench: its failed-layouts section and exit 1, in make test-slow
def test_a_failing_layout_is_reported_and_exits_1(tiny_report, tmp_path):
    """ulysses3 cannot split tiny-wan's 4 heads: `gen run` refuses it; the report says so and why."""
    out = tmp_path / "failed"
    out.mkdir()
    (out / "report.md").write_text("last night's report")  # --overwrite replaces it
    result = run_cli("bench", "--suite", "tiny", "--layouts", "ulysses3", "--out", str(out), "--overwrite",
                     "--model-cache", tiny_report.model_cache)
    assert result.returncode == JOBS_FAILED, result.stderr
    assert "ulysses3 FAILED (exit " in result.stderr
    with open(os.path.join(out, "report.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert "## Failed layouts" in text and "### ulysses3" in text
    tail = text.split("### ulysses3", 1)[1].split("```")[1]
    assert tail.strip()  # the end of the run's output, to say why (normally: 3 does not divide 4 heads)
    assert not os.path.exists(os.path.join(out, "plots"))
