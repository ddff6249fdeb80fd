"""Stage and step timing that does not slow the work it measures.

On CUDA, boundaries are CUDA events read once per job (no synchronisation per step); on the CPU they are
`perf_counter` readings. Each finished interval becomes one row of the timings table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


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
        self.intervals.append(_Interval(stage, step, start, end, extra))

    def stage(self, stage: str, **extra) -> "_StageContext":
        """`with timer.stage("vae_decode"):` times the block as one interval."""
        return _StageContext(self, stage, extra)

    def rows(self, **common) -> list[dict]:
        """One row per interval (waits for the device once), with `common` columns added to each."""
        if self.device.type == "cuda" and self.intervals:
            torch.cuda.synchronize(self.device)
        rows = []
        for interval in self.intervals:
            if interval.start.event is not None:
                seconds = interval.start.event.elapsed_time(interval.end.event) / 1000.0
            else:
                seconds = interval.end.clock - interval.start.clock
            rows.append(
                {**common, "stage": interval.stage, "step": interval.step, "start": interval.start.wall,
                 "seconds": seconds, **interval.extra}
            )
        return rows

    def seconds_by_stage(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for row in self.rows():
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
