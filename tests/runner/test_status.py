"""`gen status`'s rate: jobs per hour over the spans of the attempts that wrote them, and the ETA it gives."""

import pyarrow as pa

from genbatch.io.throughput import throughput
from genbatch.runner.status import format_status


def _rows(run: str, start: float, jobs: int, seconds: float) -> list[dict]:
    """A run attempt writing `jobs` jobs one after the other from `start`, each `seconds` long."""
    rows = []
    for index in range(jobs):
        begin = start + index * seconds
        rows += [{"run_id": run, "job_id": f"{run}-{index}", "stage": "denoise_step", "start": begin,
                  "seconds": seconds - 1.0},
                 {"run_id": run, "job_id": f"{run}-{index}", "stage": "write", "start": begin + seconds - 1.0,
                  "seconds": 1.0}]
    return rows


def test_jobs_per_hour_leave_out_the_time_between_attempts():
    first = _rows("a", 1_000.0, jobs=10, seconds=36.0)  # 10 jobs in 360 s
    second = _rows("b", 50_000.0, jobs=20, seconds=36.0)  # requeued hours later: 20 jobs in 720 s
    assert abs(throughput(pa.Table.from_pylist(first + second)) - 100.0) < 1e-9  # 30 jobs in 1080 s
    unwritten = [row for row in first if row["stage"] != "write"]
    assert throughput(pa.Table.from_pylist(unwritten)) is None
    assert throughput(pa.table({})) is None


def test_the_line_gives_the_rate_and_the_eta():
    counts = {"total": 10, "done": 4, "failed": 0, "rejected": 0, "pending": 6, "jobs_per_hour": 2.0, "eta_s": 10800}
    assert format_status(counts) == ("total: 10  done: 4  failed: 0  rejected: 0  pending: 6  jobs/hour: 2.0  "
                                     "eta: 3h 00m")
    assert format_status({**counts, "jobs_per_hour": None, "eta_s": None}).endswith("jobs/hour: -  eta: -")
    assert format_status({**counts, "eta_s": 754}).endswith("eta: 12m 34s")
