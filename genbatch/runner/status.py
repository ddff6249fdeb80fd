"""`gen status OUT`: what a run has done, against its manifest."""

from __future__ import annotations


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
        raise FileNotFoundError(f"{out} has no run.json: pass --manifest to count against a manifest")
    manifest = manifest or info["manifest"]
    overrides = JobOverrides.from_record((info or {}).get("overrides", {})) if info else JobOverrides()
    if overrides.model is None and info and info.get("model"):  # the run's --model, as the run resolved rows
        overrides.model = info["model"]
    loaded = read_jobs(manifest, overrides=overrides, storage_options=storage_options)
    counts = store.status_counts(job.id for job in loaded.jobs)
    counts["rejected"] = len(loaded.rejected)
    return {"total": len(loaded.jobs) + len(loaded.rejected), **counts}
