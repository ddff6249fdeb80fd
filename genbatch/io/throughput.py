"""Jobs per hour of a run, from its timing rows.

    throughput(timings)   jobs written / hours, each run attempt over its own span (first start to last end)

Each attempt counts over its own span, so the hours between a preemption and its requeue do not count. `gen
status` gives it with an ETA; `gen report` prints it in its summary.
"""

from __future__ import annotations

WRITE_STAGE = "write"
"""The timing stage of a job's output write: one per done job and attempt."""


def throughput(timings) -> float | None:
    """Jobs per hour of the timings (an Arrow table of timing rows): the jobs written over the spans of the
    attempts that wrote them; None without a written job."""
    import pyarrow.compute as pc

    if timings.num_rows == 0 or "stage" not in timings.column_names:
        return None
    ends = pc.add(timings["start"], timings["seconds"])
    written, hours = 0, 0.0
    runs = timings["run_id"] if "run_id" in timings.column_names else None
    for run in (pc.unique(runs).to_pylist() if runs is not None else [None]):
        mask = pc.equal(runs, run) if run is not None else None
        part, part_ends = (timings.filter(mask), ends.filter(mask)) if mask is not None else (timings, ends)
        jobs = pc.count_distinct(part.filter(pc.equal(part["stage"], WRITE_STAGE))["job_id"]).as_py()
        if jobs:
            written += jobs
            hours += (pc.max(part_ends).as_py() - pc.min(part["start"]).as_py()) / 3600.0
    if not written or hours <= 0:
        return None
    return written / hours
