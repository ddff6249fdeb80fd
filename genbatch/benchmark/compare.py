"""Tonight's metrics against a baseline (a previous report): the change per metric and the verdict.

The baseline's metrics are recomputed from its timings.parquet with today's definitions, so a change in how
a metric is computed never reads as a regression. Seconds and bytes regress when they rise by more than the
threshold (seconds also by more than `NOISE_FLOOR_S`), jobs per hour when it falls by more than it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genbatch.benchmark.metrics import HIGHER_IS_BETTER, LayoutMetrics, report_metrics

NOISE_FLOOR_S = 0.01
"""A seconds metric that moved by less than this is never a regression (timer and scheduler noise)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """One metric of one layout, tonight against the baseline."""

    layout: str
    metric: str
    baseline: float
    current: float
    regression: bool
    """True when the metric got worse by more than the threshold."""

    @property
    def relative(self) -> float:
        """current / baseline - 1 (inf when the baseline is 0 and tonight is not)."""
        if self.baseline == 0:
            return 0.0 if self.current == 0 else math.inf
        return self.current / self.baseline - 1.0

    @property
    def better(self) -> bool:
        return self.relative > 0 if self.metric in HIGHER_IS_BETTER else self.relative < 0


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Every compared metric, the layouts only one side has, and the verdict."""

    baseline_url: str
    threshold: float
    changes: list[Change] = field(default_factory=list)
    only_current: list[str] = field(default_factory=list)
    """Layouts the baseline did not run (not compared)."""
    only_baseline: list[str] = field(default_factory=list)
    """Layouts tonight did not run (not compared)."""

    @property
    def regressions(self) -> list[Change]:
        return [change for change in self.changes if change.regression]


def _is_regression(metric: str, baseline: float, current: float, threshold: float) -> bool:
    if metric in HIGHER_IS_BETTER:
        return current < baseline * (1.0 - threshold)
    worse = current > baseline * (1.0 + threshold)
    if metric.endswith("_s") or metric == "seconds_per_step":
        return worse and current - baseline > NOISE_FLOOR_S
    return worse


def compare(current: dict[str, LayoutMetrics], baseline: dict[str, LayoutMetrics], *, threshold: float,
            baseline_url: str = "") -> Comparison:
    """Compare the layouts both sides ran, metric by metric."""
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold {threshold} must be a fraction in [0, 1), e.g. 0.05 for 5%")
    result = Comparison(baseline_url=baseline_url, threshold=threshold,
                        only_current=[name for name in current if name not in baseline],
                        only_baseline=[name for name in baseline if name not in current])
    for name, metrics in current.items():
        if name not in baseline:
            continue
        before = baseline[name].compared()
        for metric, value in metrics.compared().items():
            if metric not in before:
                continue
            result.changes.append(Change(layout=name, metric=metric, baseline=before[metric], current=value,
                                         regression=_is_regression(metric, before[metric], value, threshold)))
    return result


def load_baseline(url: str, storage_options: dict | None = None) -> dict[str, LayoutMetrics]:
    """Metrics of a previous report: its folder's URL (or its timings.parquet itself)."""
    from genbatch.io.options import open_filesystem
    from genbatch.io.tables import from_parquet_bytes

    fs, root, _ = open_filesystem(url, storage_options)
    path = root if root.endswith(".parquet") else f"{root}/timings.parquet"
    if not fs.isfile(path):
        raise FileNotFoundError(
            f"baseline {url!r} has no timings.parquet; pass the OUT folder of an earlier `gen bench` run"
        )
    metrics = report_metrics(from_parquet_bytes(fs.cat_file(path)))
    if not metrics:
        raise ValueError(f"baseline {url!r} holds no timed layouts; pass the OUT folder of a `gen bench` run that ran")
    return metrics


def format_change(change: Change) -> str:
    """`+4.2%` / `-1.0%` / `new` (baseline 0)."""
    if math.isinf(change.relative):
        return "new"
    return f"{change.relative * 100:+.1f}%"


def comparison_lines(comparison: Comparison) -> list[str]:
    """Plain-text lines for the terminal: one per metric, then the verdict."""
    lines = [f"compared with {comparison.baseline_url} (threshold {comparison.threshold:.0%}):"]
    for change in comparison.changes:
        flag = "REGRESSION" if change.regression else ("better" if change.better else "")
        lines.append(f"  {change.layout:16s} {change.metric:18s} {_number(change.baseline):>12s} -> "
                     f"{_number(change.current):>12s}  {format_change(change):>8s}  {flag}")
    one_side = (("not in the baseline", comparison.only_current), ("not run tonight", comparison.only_baseline))
    for label, names in one_side:
        if names:
            lines.append(f"  {label}: {', '.join(names)}")
    count = len(comparison.regressions)
    lines.append(f"verdict: {count} regression{'s' if count != 1 else ''}" if count else "verdict: no regression")
    return lines


def _number(value: float) -> str:
    if abs(value) >= 1e5:
        return f"{value:.4g}"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
