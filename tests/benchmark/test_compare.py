"""Baseline comparison: recomputed from the baseline's timings, direction per metric, threshold, floor."""

from __future__ import annotations

import pytest

from genbatch.benchmark.compare import NOISE_FLOOR_S, compare, comparison_lines, load_baseline
from genbatch.benchmark.metrics import LayoutMetrics
from tests.benchmark.conftest import scaled_copy


def test_identical_report_has_no_regression(tiny_report):
    metrics = load_baseline(tiny_report.out)
    result = compare(metrics, metrics, threshold=0.05, baseline_url=tiny_report.out)
    assert len(result.changes) == 2 * len(metrics["single"].compared())
    assert result.regressions == []
    assert all(change.relative == 0 for change in result.changes)
    assert comparison_lines(result)[-1] == "verdict: no regression"


def test_faster_baseline_makes_time_and_throughput_regress(tiny_report, tmp_path):
    # Tonight is the tiny report slowed down enough that halving its times clears the noise floor however
    # fast this machine ran it; the baseline is tonight at half the time.
    fastest = min(m.seconds_per_step for m in load_baseline(tiny_report.out).values())
    slow = max(1.0, 4 * NOISE_FLOOR_S / fastest)
    tonight = load_baseline(scaled_copy(tiny_report.out, str(tmp_path / "tonight"), factor=slow))
    baseline = load_baseline(scaled_copy(tiny_report.out, str(tmp_path / "fast"), factor=slow * 0.5))
    result = compare(tonight, baseline, threshold=0.05)
    flagged = {(c.layout, c.metric) for c in result.regressions}
    for layout in ("single", "ulysses2"):
        assert (layout, "seconds_per_step") in flagged
        assert (layout, "jobs_per_hour") in flagged  # higher is better: it fell
        assert (layout, "bytes_per_step") not in flagged  # unchanged
    change = next(c for c in result.changes if c.layout == "single" and c.metric == "seconds_per_step")
    assert change.relative == pytest.approx(1.0)  # twice the baseline's seconds
    assert "REGRESSION" in "\n".join(comparison_lines(result))


def test_slower_baseline_is_an_improvement(tiny_report, tmp_path):
    tonight = load_baseline(tiny_report.out)
    baseline = load_baseline(scaled_copy(tiny_report.out, str(tmp_path / "slow"), factor=2.0))
    result = compare(tonight, baseline, threshold=0.05)
    assert result.regressions == []
    speed = next(c for c in result.changes if c.layout == "ulysses2" and c.metric == "jobs_per_hour")
    assert speed.better and speed.relative == pytest.approx(1.0)


def test_more_bytes_sent_is_a_regression(tiny_report, tmp_path):
    tonight = load_baseline(tiny_report.out)
    baseline = load_baseline(scaled_copy(tiny_report.out, str(tmp_path / "bytes"), factor=1.0, byte_factor=0.5))
    flagged = {(c.layout, c.metric) for c in compare(tonight, baseline, threshold=0.05).regressions}
    assert flagged == {("ulysses2", "bytes_per_step")}  # single sends nothing either way


def _metrics(seconds_per_step: float, jobs_per_hour: float, name: str = "single") -> LayoutMetrics:
    return LayoutMetrics(layout=name, world=1, jobs=1, seconds_per_step=seconds_per_step, step_seconds=[],
                         stage_seconds={"denoise": seconds_per_step * 4}, jobs_per_hour=jobs_per_hour, bytes_per_step=0)


def test_threshold_and_noise_floor():
    base = {"single": _metrics(1.0, 100.0)}
    assert compare({"single": _metrics(1.04, 96.0)}, base, threshold=0.05).regressions == []
    flagged = {c.metric for c in compare({"single": _metrics(1.06, 94.0)}, base, threshold=0.05).regressions}
    assert flagged == {"seconds_per_step", "jobs_per_hour", "denoise_s"}
    # +50% of a few milliseconds is scheduler noise, not a regression
    tiny = {"single": _metrics(NOISE_FLOOR_S / 10, 100.0)}
    slower = {"single": _metrics(NOISE_FLOOR_S / 10 * 1.5, 100.0)}
    assert compare(slower, tiny, threshold=0.05).regressions == []


def test_layouts_on_one_side_only_are_listed_not_compared():
    result = compare({"single": _metrics(1, 1), "dp2": _metrics(1, 2, "dp2")},
                     {"single": _metrics(1, 1), "ring2": _metrics(1, 1, "ring2")}, threshold=0.05)
    assert result.only_current == ["dp2"] and result.only_baseline == ["ring2"]
    assert {c.layout for c in result.changes} == {"single"}


def test_bad_threshold_and_missing_baseline(tmp_path):
    with pytest.raises(ValueError, match="fraction"):
        compare({}, {}, threshold=5)
    with pytest.raises(FileNotFoundError, match="timings.parquet"):
        load_baseline(str(tmp_path))
