"""The numbers of a report's summary: seconds per stage, and each rank's busy time from the timings.

    stage_seconds(jobs)    {stage: (jobs, total s, mean s)} over the done jobs
    rank_busy(timings)     [RankBusy(rank, busy_s, span_s)], busy: the union of the rank's timed intervals

A rank's span is the span of each run attempt it took part in (first start to last end, over every rank of
that attempt), summed over attempts; busy over span is how much of the run the rank worked, so a group that
sat idle shows as short bars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(kw_only=True, slots=True, frozen=True)
class RankBusy:
    """One rank's work over the run."""

    rank: int
    busy_s: float
    """Seconds covered by at least one of the rank's timing rows (overlapping rows count once)."""
    span_s: float
    """Seconds of the attempts the rank ran in (each attempt's first start to its last end)."""

    @property
    def fraction(self) -> float:
        return self.busy_s / self.span_s if self.span_s > 0 else 0.0


def stage_seconds(jobs) -> dict[str, tuple[int, float, float]]:
    """Per stage (in first-seen order), over the done jobs that timed it: (jobs, total seconds, mean seconds)."""
    totals: dict[str, list[float]] = {}
    for job in jobs:
        if job.status != "done":
            continue
        for stage, seconds in job.stages.items():
            entry = totals.setdefault(stage, [0, 0.0])
            entry[0] += 1
            entry[1] += seconds
    return {stage: (int(count), total, total / count) for stage, (count, total) in totals.items()}


def rank_busy(timings: pa.Table) -> list[RankBusy]:
    """Busy and span seconds per rank, over every attempt (see the module docstring); [] without timings."""
    if timings.num_rows == 0 or not {"rank", "start", "seconds"} <= set(timings.column_names):
        return []
    starts = timings["start"].to_numpy(zero_copy_only=False).astype(np.float64)
    ends = starts + timings["seconds"].to_numpy(zero_copy_only=False).astype(np.float64)
    ranks = timings["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    runs = (np.unique(timings["run_id"].to_numpy(zero_copy_only=False).astype(str), return_inverse=True)[1]
            if "run_id" in timings.column_names else np.zeros(len(ranks), np.int64))
    # one group per (attempt, rank); groups laid end to end on one time axis so one running max serves all
    rank_ids, rank_index = np.unique(ranks, return_inverse=True)
    group = runs.astype(np.int64) * len(rank_ids) + rank_index
    origin, width = starts.min(), (ends.max() - starts.min()) + 1.0
    shifted_starts, shifted_ends = starts - origin + group * width, ends - origin + group * width
    order = np.lexsort((shifted_starts, group))
    s, e, g = shifted_starts[order], shifted_ends[order], group[order]
    reach = np.maximum.accumulate(e)  # the furthest end of this row and every earlier one
    before = np.concatenate(([-np.inf], reach[:-1]))
    covered = np.clip(e - np.maximum(s, before), 0.0, None)  # the part of this row no earlier row covers
    busy = np.bincount(g, weights=covered, minlength=int(group.max()) + 1)
    # each attempt's span (first start to last end over all its ranks), charged to every rank that ran in it
    run_count = int(runs.max()) + 1
    first, last = np.full(run_count, np.inf), np.full(run_count, -np.inf)
    np.minimum.at(first, runs, starts)
    np.maximum.at(last, runs, ends)
    present = np.unique(group)  # the (attempt, rank) groups that have rows
    run_of, rank_of = present // len(rank_ids), present % len(rank_ids)
    busy_per_rank = np.bincount(rank_of, weights=busy[present], minlength=len(rank_ids))
    span_per_rank = np.bincount(rank_of, weights=(last - first)[run_of], minlength=len(rank_ids))
    return [RankBusy(rank=int(rank), busy_s=float(busy_per_rank[i]), span_s=float(span_per_rank[i]))
            for i, rank in enumerate(rank_ids)]
