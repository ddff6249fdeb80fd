"""Rows a layout with stale K/V cannot run: each rejected alone, naming the numbers, while the rest go on.

Under `--distrifusion` every rank keeps the K/V of all tokens for every layer (`genbatch.planner.stale_fit`);
a row too large for that beside the weights is rejected at start-up (column `width`: its size is the cause)
instead of failing out of memory mid-run. Under `--pipefusion` a row whose latent has fewer token rows than
`--patches` is rejected (column `height`), naming the patches that would work. Exact runs check nothing here
and pay nothing.
"""

from __future__ import annotations

import numpy as np

from genbatch.jobs.table import JobTable
from genbatch.manifests.validate import Rejection
from genbatch.models import resolve_model
from genbatch.parallel.dims import ParallelDims
from genbatch.parallel.pipeline.session import patch_problem
from genbatch.planner.shapes import shape_from_spec
from genbatch.planner.stale_fit import stale_fit_problem


def _problem(spec, shape, job, layout: ParallelDims, memory_bytes: float, element_bytes: int,
             patches: int | None) -> tuple[str, str] | None:
    """(column, reason) when the job cannot run under this layout's stale K/V, else None."""
    if layout.pp > 1 and patches is not None:
        reason = patch_problem(spec, job.width, job.height, job.num_frames, patches)
        if reason is not None:
            return "height", reason
    reason = stale_fit_problem(shape, job.width, job.height, job.num_frames, layout, memory_bytes, element_bytes)
    return None if reason is None else ("width", reason)


def reject_unfit(jobs: JobTable, layout: ParallelDims, memory_bytes: float, element_bytes: int,
                 patches: int | None = None) -> tuple[JobTable, list[Rejection]]:
    """(the jobs that run under this layout's stale K/V, a `Rejection` for each of the others): under
    DistriFusion their K/V must fit in `memory_bytes` per rank; under PipeFusion their latent must have a token
    row for each of the `patches`."""
    if (layout.distrifusion == 1 and layout.pp == 1) or not len(jobs):
        return jobs, []
    models, problems = {}, {}
    keep = np.ones(len(jobs), dtype=bool)
    rejected = []
    for position, job in enumerate(jobs):
        if job.model not in models:
            spec = resolve_model(job.model)
            models[job.model] = (spec, shape_from_spec(spec))
        size = (job.model, job.width, job.height, job.num_frames)
        if size not in problems:
            problems[size] = _problem(*models[job.model], job, layout, memory_bytes, element_bytes, patches)
        if problems[size] is not None:
            keep[position] = False
            column, reason = problems[size]
            rejected.append(Rejection(row=job.row, job_id=job.id, column=column, reason=reason, model=job.model,
                                      extra=dict(job.extra)))
    return (jobs.where(keep) if rejected else jobs), rejected
