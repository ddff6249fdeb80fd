"""From the timings table of a report (all layouts) to the numbers a report shows and a baseline compares.

Every number is about a job group, not a rank: a step of a sequence-parallel job takes as long as its
slowest rank, so per (job, step) the slowest rank's seconds count. Throughput is whole jobs over the span
from the first timed stage to the last write (process start-up and model loading excluded; they are in
the report's wall seconds).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from genbatch.io.stage_names import COMPRESS, current_stage

STAGES = ("text_encode", "denoise", "vae_decode", COMPRESS, "write")
"""Stages of a job in run order (`denoise` is the sum of its steps)."""

HIGHER_IS_BETTER = frozenset({"jobs_per_hour", "psnr_db", "ssim"})
"""Metrics where a fall is the regression; for every other metric a rise is."""


@dataclass(kw_only=True, slots=True)
class LayoutMetrics:
    """The measured numbers of one layout."""

    layout: str
    """The layout's name (`single`, `dp2`, ...)."""
    world: int
    """Processes it ran on."""
    jobs: int
    """Jobs with timed denoising steps."""
    seconds_per_step: float
    """Median over jobs and steps of a step's seconds (the slowest rank of the job's group)."""
    step_seconds: list[float]
    """By step index: the median over jobs (for the per-step plot)."""
    stage_seconds: dict[str, float]
    """Mean seconds per job of each stage (the slowest rank), in `STAGES` order."""
    jobs_per_hour: float
    """Jobs over the span from the first job's first stage to the last job's write."""
    bytes_per_step: float
    """Mean bytes one rank sends per denoising step (all collective kinds)."""
    peak_decode_bytes: int | None = None
    """The largest VAE-decode peak memory of any rank, when recorded."""
    efficiency: float | None = None
    """jobs/hour over (processes x jobs/hour of `single`); None without a `single` layout."""
    step_speedup: float | None = None
    """Seconds per step of `single` over this layout's."""
    extra: dict = field(default_factory=dict)
    """Report-only facts (wall seconds, exit status) that a baseline does not compare."""

    def compared(self) -> dict[str, float]:
        """The metrics a baseline comparison looks at, flat."""
        values = {"seconds_per_step": self.seconds_per_step, "jobs_per_hour": self.jobs_per_hour}
        values.update({f"{stage}_s": seconds for stage, seconds in self.stage_seconds.items()})
        values["bytes_per_step"] = self.bytes_per_step
        return values


def _byte_columns(names: list[str]) -> list[str]:
    return [name for name in names if name.startswith("bytes_")]


def layout_metrics(rows: list[dict], layout: str, world: int) -> LayoutMetrics:
    """The metrics of one layout from its timing rows (dicts with the timings table's columns)."""
    byte_columns = _byte_columns(sorted({key for row in rows for key in row}))
    step_time: dict[tuple[str, int], float] = defaultdict(float)
    stage_time: dict[tuple[str, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    step_bytes, peaks = [], []
    for row in rows:
        stage = "denoise" if row["stage"] == "denoise_step" else current_stage(row["stage"])  # an old night's too
        stage_time[(row["job_id"], stage)][row["rank"]] += row["seconds"]
        if row["stage"] == "denoise_step":
            key = (row["job_id"], row["step"])
            step_time[key] = max(step_time[key], row["seconds"])
            step_bytes.append(sum(row.get(column) or 0 for column in byte_columns))
        if row.get("peak_bytes") is not None:
            peaks.append(int(row["peak_bytes"]))
    if not step_time:
        raise ValueError(f"layout {layout!r} has no timed denoising steps: did its run fail? See its runs/ folder")
    jobs = sorted({job for job, _ in step_time})
    by_step: dict[int, list[float]] = defaultdict(list)
    for (_, step), seconds in step_time.items():
        by_step[step].append(seconds)
    stage_seconds = {}
    for stage in STAGES:
        per_job = [max(stage_time[(job, stage)].values()) for job in jobs if (job, stage) in stage_time]
        if per_job:
            stage_seconds[stage] = statistics.fmean(per_job)
    first = min(row["start"] for row in rows)
    last = max(row["start"] + row["seconds"] for row in rows)
    return LayoutMetrics(
        layout=layout,
        world=world,
        jobs=len(jobs),
        seconds_per_step=statistics.median(step_time.values()),
        step_seconds=[statistics.median(by_step[step]) for step in sorted(by_step)],
        stage_seconds=stage_seconds,
        jobs_per_hour=3600.0 * len(jobs) / max(last - first, 1e-9),
        bytes_per_step=statistics.fmean(step_bytes),
        peak_decode_bytes=max(peaks) if peaks else None,
    )


def report_metrics(timings: pa.Table) -> dict[str, LayoutMetrics]:
    """Metrics by layout, in the table's layout order, with efficiency against `single` when it ran."""
    if timings.num_rows == 0 or "layout" not in timings.column_names:
        return {}
    grouped: dict[str, list[dict]] = {}
    for row in timings.to_pylist():
        grouped.setdefault(row["layout"], []).append(row)
    metrics = {name: layout_metrics(rows, name, rows[0]["world"]) for name, rows in grouped.items()}
    reference = metrics.get("single")
    if reference is not None:
        for item in metrics.values():
            item.efficiency = item.jobs_per_hour / (item.world * reference.jobs_per_hour)
            item.step_speedup = reference.seconds_per_step / item.seconds_per_step
    return metrics
