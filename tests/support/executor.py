"""A job executor driven one job (or one given batch) at a time, as tests drive it: the rows prepared here (a
row that cannot be prepared raises `RowNotPrepared`), then the executor's own stages. genbatch itself runs only
whole batches (`JobExecutor.run_batch`), which keeps its failed rows."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from genbatch.jobs.prepared import PreparedJob
from genbatch.jobs.spec import JobSpec
from genbatch.runner.execute import BatchResult, DecodedRow, JobExecutor, JobModel
from genbatch.runner.timing import JobTimer


class RowNotPrepared(ValueError):
    """A given job whose inputs could not be prepared (the message says which row, column and why)."""


def prepared(executor: JobExecutor, jobs: list[JobSpec], timer: JobTimer, model: JobModel | None = None
             ) -> list[PreparedJob]:
    """`jobs` as they run: prepared by the executor unless they already are."""
    if all(isinstance(job, PreparedJob) for job in jobs):
        return list(jobs)
    batch = executor.prepare(jobs, model or executor.model_for(jobs[0]), timer)
    if batch.failures:
        raise RowNotPrepared(batch.failures[0].message())
    return batch.jobs


def generate_rows(executor: JobExecutor, jobs: list[JobSpec], timer: JobTimer, model: JobModel | None = None
                  ) -> list[DecodedRow]:
    """Each row's frames and sound on the leader (`DecodedRow`)."""
    model = model or executor.model_for(jobs[0])
    return executor.generate_batch(prepared(executor, jobs, timer, model), timer, model)


def generate_batch(executor: JobExecutor, jobs: list[JobSpec], timer: JobTimer, model: JobModel | None = None):
    """Each row's [0, 1] frames on the leader (None elsewhere)."""
    return [row.frames for row in generate_rows(executor, jobs, timer, model)]


def generate(executor: JobExecutor, job: JobSpec, timer: JobTimer, model: JobModel | None = None):
    """The job's [0, 1] frames on the leader (None elsewhere)."""
    return generate_batch(executor, [job], timer, model)[0]


def denoise_batch(executor: JobExecutor, jobs: list[JobSpec], timer: JobTimer,
                  model: JobModel | None = None) -> torch.Tensor:
    """The rows' final latents, joined along dim 0."""
    model = model or executor.model_for(jobs[0])
    return executor.denoise_batch(prepared(executor, jobs, timer, model), timer, model)


def denoise(executor: JobExecutor, job: JobSpec, timer: JobTimer, model: JobModel | None = None) -> torch.Tensor:
    """The job's final latents."""
    return denoise_batch(executor, [job], timer, model)


def decode_row(executor: JobExecutor, job: JobSpec, latents: torch.Tensor, timer: JobTimer,
               model: JobModel | None = None) -> DecodedRow:
    """The job's frames and sound from its final latents, on the leader (`DecodedRow`)."""
    model = model or executor.model_for(job)
    return executor.decode_batch(prepared(executor, [job], timer, model), latents, timer, model)[0]


def decode(executor: JobExecutor, job: JobSpec, latents: torch.Tensor, timer: JobTimer,
           model: JobModel | None = None):
    """The job's [0, 1] frames from its final latents, on the leader (None elsewhere)."""
    return decode_row(executor, job, latents, timer, model).frames


def decode_batch(executor: JobExecutor, jobs: list[JobSpec], latents: torch.Tensor, timer: JobTimer,
                 model: JobModel | None = None):
    """Each row's [0, 1] frames from the batch's final latents, on the leader (None elsewhere)."""
    model = model or executor.model_for(jobs[0])
    return [row.frames for row in executor.decode_batch(prepared(executor, jobs, timer, model), latents, timer, model)]


def run(executor: JobExecutor, job: JobSpec) -> BatchResult:
    """`run_batch` of the one job; RowNotPrepared when its inputs could not be prepared."""
    result = executor.run_batch([job])
    if result.failures:
        raise RowNotPrepared(result.failures[0].message())
    return result


def use_stale(executor: JobExecutor, stale, resync_steps=()) -> None:
    """Run the executor's next jobs under `stale` (a `StaleConfig`, None: exact), resynchronising at
    `resync_steps` besides each job's warm-up."""
    executor.features = replace(executor.features, stale=stale, resync_steps=frozenset(resync_steps))


@contextlib.contextmanager
def hook_summaries():
    """The summaries of the per-job hooks of every job denoised inside (`JobHooks.summary`: the step cache's
    `cache_indicators`, the stale K/V's `stale_peak_bytes`), in order: a list filled as jobs end."""
    from unittest import mock

    import genbatch.runner.execute as execute

    summaries: list[dict] = []
    real = execute.start_hooks

    @contextlib.contextmanager
    def recording(start):
        with real(start) as hooks:
            try:
                yield hooks
            finally:
                summaries.append(hooks.summary())

    with mock.patch.object(execute, "start_hooks", recording):
        yield summaries
