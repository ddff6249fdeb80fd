"""Measured denoising steps, read back from what `gen run` and `gen bench` wrote (torch-free: pyarrow only).

A run folder holds `timings/*.parquet` (one row per rank, stage and step: `denoise_step` rows carry
`seconds` and `bytes_KIND` per collective kind, and the `layout` name), `run.json` (the layout, world size
and device) and `results/results.parquet` (each job's model, size and steps). A `gen bench` report holds one
such run per layout under `runs/<layout>/`; either folder may be given.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from genbatch.parallel.dims import ParallelDims

STEP_STAGE = "denoise_step"
"""The timings' stage of one denoising step."""
IGNORED_KINDS = ("control",)
"""Byte-ledger kinds that are not part of the step's work (a few bytes of stop checks)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSample:
    """One measured denoising step of one job: its seconds (the mean over the ranks) and its inputs."""

    run: str
    """The run folder it came from."""
    job_id: str
    """The job."""
    step: int
    """Its index in the job."""
    model: str
    """The model as the run named it (a preset, a published name or a pipeline folder)."""
    layout: ParallelDims
    """The layout it ran under."""
    ranks: int
    """Processes of the run on the machine."""
    device: str
    """`cpu` or `cuda` (run.json's device)."""
    width: int
    height: int
    frames: int | None
    steps: int
    """The job's size and denoising steps (results.parquet)."""
    seconds: float
    """Wall seconds of the step, averaged over the ranks."""
    bytes_sent: dict[str, float] = field(default_factory=dict)
    """Bytes this rank sent in the step by collective kind (averaged over the ranks)."""
    cpu_cores: int | None = None
    """The CPU cores the run had (run.json's `cpu_cores`; None from runs that did not record it)."""


def run_folders(directory: str) -> list[str]:
    """The run folders under `directory`: itself when it is a run, else a `gen bench` report's `runs/*`."""
    if os.path.isdir(os.path.join(directory, "timings")):
        return [directory]
    runs = sorted(path for path in glob.glob(os.path.join(directory, "runs", "*"))
                  if os.path.isdir(os.path.join(path, "timings")))
    if not runs:
        raise ValueError(f"{directory} has no step timings (no timings/ folder, nor runs/*/timings/); give the "
                         "OUT folder of a `gen run` or a `gen bench`")
    return runs


def _run_info(run: str) -> dict:
    path = os.path.join(run, "run.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def _jobs(run: str) -> dict[str, dict]:
    path = os.path.join(run, "results", "results.parquet")
    if not os.path.isfile(path):
        raise ValueError(f"{run} has no results/results.parquet, so the jobs' sizes are unknown; "
                         "give a run folder that finished some jobs")
    return {row["id"]: row for row in pq.read_table(path).to_pylist() if row.get("status") == "done"}


def read_steps(run: str, *, skip_first: bool = True) -> list[StepSample]:
    """Every timed denoising step of the run's finished jobs (without each job's first, warm-up, step when it
    has more than one and `skip_first`)."""
    info, jobs = _run_info(run), _jobs(run)
    files = sorted(glob.glob(os.path.join(run, "timings", "*.parquet")))
    grouped: dict[tuple[str, int], list[dict]] = {}
    for path in files:
        for row in pq.read_table(path).to_pylist():
            if row.get("stage") == STEP_STAGE and row.get("job_id") in jobs and row.get("step") is not None:
                grouped.setdefault((row["job_id"], row["step"]), []).append(row)
    if not grouped:
        raise ValueError(f"{run} has no timed denoising steps of finished jobs in timings/*.parquet")
    last_step = {job: max(step for (other, step) in grouped if other == job) for job, _ in grouped}
    samples = []
    for (job_id, step), rows in sorted(grouped.items()):
        if skip_first and step == 0 and last_step[job_id] > 0:
            continue
        name = rows[0].get("layout") or info.get("layout")
        if not name:
            raise ValueError(f"{run}: no layout in the timings' layout column nor in run.json")
        job = jobs[job_id]
        kinds = {key[len("bytes_"):] for row in rows for key, value in row.items()
                 if key.startswith("bytes_") and value}
        samples.append(StepSample(
            run=run, job_id=job_id, step=step, model=job["model"], layout=ParallelDims.parse(name),
            ranks=int(info.get("world_size") or ParallelDims.parse(name).world_size),
            device=str(info.get("device", "cuda")), width=int(job["width"]), height=int(job["height"]),
            frames=job.get("num_frames"), steps=int(job["num_inference_steps"]),
            seconds=sum(row["seconds"] for row in rows) / len(rows),
            bytes_sent={kind: sum(row.get(f"bytes_{kind}") or 0 for row in rows) / len(rows)
                        for kind in sorted(kinds) if kind not in IGNORED_KINDS},
            cpu_cores=info.get("cpu_cores"),
        ))
    return samples
