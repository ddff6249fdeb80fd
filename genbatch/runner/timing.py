"""Stage and step timing that does not slow the work it measures.

On CUDA, boundaries are CUDA events read once per job (no synchronisation per step); on the CPU they are
`perf_counter` readings. Each finished interval becomes one row of the timings table.

Compiles (`--compile`) happen inside the first steps that meet a new shape. Each one dynamo ran during an
interval (`genbatch.parallel.compile.CLOCK`) becomes a `compile` row of its own, with its seconds, the block
class (`unit`) and its input `shape`, at the step it happened in; the interval's own row excludes those
seconds, so a step row is the step's run time and nothing is counted twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from genbatch.parallel.compile import CLOCK


@dataclass(slots=True)
class _Mark:
    wall: float
    clock: float
    event: torch.cuda.Event | None


@dataclass(slots=True)
class _Interval:
    stage: str
    step: int | None
    start: _Mark
    end: _Mark
    extra: dict
    excluded: float = 0.0
    """Seconds inside the interval that belong to other rows (compiles)."""
    seconds: float | None = None
    """The interval's length when known directly (a compile's), instead of from its marks."""


@dataclass(slots=True)
class JobTimer:
    """Collects the timed intervals of one job on one rank."""

    device: torch.device
    intervals: list[_Interval] = field(default_factory=list)

    def mark(self) -> _Mark:
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return _Mark(wall=time.time(), clock=time.perf_counter(), event=event)

    def add(self, stage: str, start: _Mark, end: _Mark, step: int | None = None, **extra) -> None:
        excluded = 0.0
        for event in CLOCK.take():  # compiles that ran since the last interval ended
            began = _Mark(wall=end.wall - (end.clock - event.start), clock=event.start, event=None)
            self.intervals.append(_Interval("compile", step, began, end, {"unit": event.unit, "shape": event.shape},
                                            seconds=event.seconds))
            overlap = min(end.clock, event.start + event.seconds) - max(start.clock, event.start)
            excluded += max(0.0, overlap)
        self.intervals.append(_Interval(stage, step, start, end, extra, excluded=excluded))

    def stage(self, stage: str, **extra) -> "_StageContext":
        """`with timer.stage("vae_decode"):` times the block as one interval."""
        return _StageContext(self, stage, extra)

    def rows(self, **common) -> list[dict]:
        """One row per interval (waits for the device once), with `common` columns added to each."""
        if self.device.type == "cuda" and self.intervals:
            torch.cuda.synchronize(self.device)
        rows = []
        for interval in self.intervals:
            if interval.seconds is not None:
                seconds = interval.seconds
            elif interval.start.event is not None:
                seconds = interval.start.event.elapsed_time(interval.end.event) / 1000.0
            else:
                seconds = interval.end.clock - interval.start.clock
            seconds = max(0.0, seconds - interval.excluded)
            rows.append(
                {**common, "stage": interval.stage, "step": interval.step, "start": interval.start.wall,
                 "seconds": seconds, **interval.extra}
            )
        return rows

    def seconds_by_stage(self, job_id: str | None = None) -> dict[str, float]:
        """Seconds by stage (the steps as `denoise`); with `job_id`, of a batch's shared intervals and that job's
        own (the intervals that name it as `job_id`), leaving out its batch-mates' own."""
        totals: dict[str, float] = {}
        for row in self.rows():
            if job_id is not None and row.get("job_id", job_id) != job_id:
                continue
            key = "denoise" if row["stage"] == "denoise_step" else row["stage"]
            totals[key] = totals.get(key, 0.0) + row["seconds"]
        return totals


@dataclass(slots=True)
class _StageContext:
    timer: JobTimer
    stage: str
    extra: dict
    start: _Mark | None = None

    def __enter__(self) -> "_StageContext":
        self.start = self.timer.mark()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.add(self.stage, self.start, self.timer.mark(), **self.extra)
