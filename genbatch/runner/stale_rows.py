"""Rows a layout with stale K/V cannot run: each rejected alone, naming the numbers, while the rest go on.

Under `--distrifusion` every rank keeps the K/V of all tokens for every layer (`genbatch.planner.stale_fit`);
a row too large for that beside the weights is rejected at start-up (column `width`: its size is the cause)
instead of failing out of memory mid-run. Exact runs check nothing here and pay nothing.
"""

from __future__ import annotations

import numpy as np

from genbatch.jobs.table import JobTable
from genbatch.manifests.validate import Rejection
from genbatch.models import resolve_model
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.shapes import shape_from_spec
from genbatch.planner.stale_fit import stale_fit_problem


def reject_unfit(jobs: JobTable, layout: ParallelDims, memory_bytes: float, element_bytes: int
                 ) -> tuple[JobTable, list[Rejection]]:
    """(the jobs whose stale K/V fit in `memory_bytes` per rank, a `Rejection` for each of the others)."""
    if layout.distrifusion == 1 or not len(jobs):
        return jobs, []
    shapes, problems = {}, {}
    keep = np.ones(len(jobs), dtype=bool)
    rejected = []
    for position, job in enumerate(jobs):
        if job.model not in shapes:
            shapes[job.model] = shape_from_spec(resolve_model(job.model))
        size = (job.model, job.width, job.height, job.num_frames)
        if size not in problems:
            problems[size] = stale_fit_problem(shapes[job.model], job.width, job.height, job.num_frames, layout,
                                               memory_bytes, element_bytes)
        if problems[size] is not None:
            keep[position] = False
            rejected.append(Rejection(row=job.row, job_id=job.id, column="width", reason=problems[size],
                                      model=job.model, extra=dict(job.extra)))
    return (jobs.where(keep) if rejected else jobs), rejected


def device_memory_bytes(device) -> float:
    """A rank's memory: the GPU's, or the machine's on a CPU run."""
    import os

    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
