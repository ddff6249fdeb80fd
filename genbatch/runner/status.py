"""`gen status OUT`: what a run has done, against its manifest, and how fast; `--failed`: which jobs failed and why.

    run_status(out)    {"total", "done", "failed", "rejected", "pending", "jobs_per_hour", "eta_s"}
    failed_jobs(out)   [{"id", "row", "column", "attempts", "reason", "error"}, ...] by manifest row

Jobs per hour come from the timings: the jobs each run attempt wrote over the span of that attempt's timing
rows (first start to last end), summed over attempts, so the hours between a preemption and its requeue do
not count. The ETA is the pending jobs at that rate (None while nothing has been timed).
"""

from __future__ import annotations

from genbatch.io.throughput import throughput
from genbatch.jobs.spec import JobOverrides


def run_status(out: str, *, manifest: str | None = None, storage_options: dict | None = None,
               storage_timeout: float = 120.0) -> dict:
    """Counts of done / failed / rejected / pending jobs (pending: valid rows not yet done); a store that keeps
    failing for `storage_timeout` seconds raises StorageError."""
    from genbatch.io import RetryPolicy, RunStore
    from genbatch.manifests import read_jobs

    store = RunStore(out, storage_options=storage_options, retry=RetryPolicy(timeout_s=storage_timeout))
    info = store.read_run_info()
    if info is None and manifest is None:
        raise no_run(store, out)
    manifest = manifest or info["manifest"]
    overrides = JobOverrides.from_record((info or {}).get("overrides", {})) if info else JobOverrides()
    if overrides.model is None and info and info.get("model"):  # the run's --model, as the run resolved rows
        overrides.model = info["model"]
    loaded = read_jobs(manifest, overrides=overrides, storage_options=storage_options)
    counts = store.status_counts(job.id for job in loaded.jobs)
    counts["rejected"] = len(loaded.rejected)
    rate = throughput(store.read_timings())
    pending = counts.get("pending", 0)
    eta = None if rate is None else (0.0 if not pending else pending / rate * 3600.0)
    return {"total": len(loaded.jobs) + len(loaded.rejected), **counts,
            "jobs_per_hour": None if rate is None else round(rate, 1), "eta_s": None if eta is None else round(eta)}


def no_run(store, out: str, *, counts: bool = True) -> FileNotFoundError:
    """The error for an OUT that holds no run: it does not exist (a mistyped path, most often), or it holds no
    run.json; each names the fix (`counts`: the command can count a manifest's rows with --manifest instead)."""
    try:
        exists = store.fs.exists(store.layout.root)
    except OSError:  # cannot tell: say what is known
        exists = True
    if not exists:
        return FileNotFoundError(f"{out} does not exist: give the --out of a `gen run` (check the path for typos)")
    manifest = (f"; or give --manifest MANIFEST to count its rows against the outputs in {out}" if counts else "")
    return FileNotFoundError(f"{out} holds no run (no run.json): give the --out of a `gen run`{manifest}")


def format_status(counts: dict) -> str:
    """One line: the counts, jobs per hour and the ETA (`-` until something was timed)."""
    shown = {key: value for key, value in counts.items() if key not in ("jobs_per_hour", "eta_s")}
    line = "  ".join(f"{key}: {value}" for key, value in shown.items())
    rate, eta = counts.get("jobs_per_hour"), counts.get("eta_s")
    return (f"{line}  jobs/hour: {'-' if rate is None else f'{rate:.1f}'}  eta: "
            f"{'-' if eta is None else _duration(eta)}")


def _duration(seconds: float) -> str:
    """4h 05m, 12m 30s, 45s."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else (f"{minutes}m {secs:02d}s" if minutes else f"{secs}s")


def failed_jobs(out: str, *, storage_options: dict | None = None, storage_timeout: float = 120.0) -> list[dict]:
    """The jobs of the run in OUT that failed and are not done since, by manifest row: each one's id, row, the
    column to blame (None when no one column is), the run attempts it failed in, the reason (the error's first
    line) and the whole error."""
    from genbatch.io import RetryPolicy, RunStore

    store = RunStore(out, storage_options=storage_options, retry=RetryPolicy(timeout_s=storage_timeout))
    if store.read_run_info() is None and not store.failed_ids():
        raise no_run(store, out, counts=False)
    listed = []
    for job_id, record in store.failures().items():
        error = str(record.get("error") or "")
        first = error.strip().split("\n", 1)[0]
        for said in (f"row {record.get('row')} (id {job_id}), ", f"row {record.get('row')} (id {job_id}): "):
            first = first.removeprefix(said)  # the line names the row and id already
        listed.append({"id": job_id, "row": record.get("row"), "column": record.get("column"),
                       "attempts": record.get("failed_runs"), "reason": first, "error": error})
    return sorted(listed, key=lambda job: (job["row"] is None, job["row"] or 0, job["id"]))


def format_failed(jobs: list[dict]) -> str:
    """One line per failed job: `id  row R  attempts A  reason`, or a line saying none failed."""
    if not jobs:
        return "no failed jobs"
    width = max(len(job["id"]) for job in jobs)
    return "\n".join(f"{job['id']:<{width}}  row {job['row']}  attempts {job['attempts']}  {job['reason']}"
                     for job in jobs)

