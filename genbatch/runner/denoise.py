"""The denoise loop: one family-agnostic loop with timed steps, CFG exchange and step-boundary control.

    for each remaining timestep:
        predict this rank's guidance branches   (sequence parallel happens inside the transformer; each
                                                 branch in its own step-cache and stale-K/V context)
        exchange branch predictions             (CFG parallel: one exchange of the prediction per step)
        combine, scheduler.step                  -> new latents (identical on every rank of the group)
        time the step                            (with the step cache's skipped count, when caching)
        after_step(step, latents)               -> checkpoint / stop at this boundary

The order of operations is the diffusers pipeline's own, so the result equals the pipeline's output.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from genbatch.models.hooks import Conditioning, Family, Trajectory
from genbatch.parallel.cache.session import StepCache
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.comm import Comm
from genbatch.parallel.patch.session import StaleSession
from genbatch.parallel.pipeline.session import PipeSession
from genbatch.runner.pipefusion import finish, patch_step, resync
from genbatch.runner.timing import JobTimer


@dataclass(kw_only=True, slots=True)
class DenoiseResult:
    latents: torch.Tensor
    """Latents after the last step run."""
    steps_done: int
    """Steps completed (equal to the number of timesteps unless stopped early)."""
    stopped: bool
    """True when `after_step` asked to stop before the last step."""


AfterStep = Callable[[int, torch.Tensor], bool]
"""Called after each step with (steps_done, latents); returning True stops the loop at this boundary."""


def denoise(
    family: Family,
    pipe,
    trajectory: Trajectory,
    conditioning: Conditioning,
    *,
    timer: JobTimer,
    exchange: BranchExchange,
    start_step: int = 0,
    latents: torch.Tensor | None = None,
    after_step: AfterStep | None = None,
    step_extra: Callable[[], dict] | None = None,
    cache: StepCache | None = None,
    cfg: Comm | None = None,
    stale: StaleSession | PipeSession | None = None,
) -> DenoiseResult:
    """Run the denoising steps from `start_step` (0, or a checkpoint's `steps_done`). `cache`: the job's step
    cache (None: none); `cfg`: the cfg group it sums its per-step count over under CFG parallel; `stale`: the
    job's stale-K/V session (None: exact attention)."""
    latents = trajectory.latents if latents is None else latents
    names = list(conditioning.branches)
    timesteps = trajectory.timesteps
    steps_done = start_step
    pipeline = stale if isinstance(stale, PipeSession) else None
    was_async = False
    for index in range(start_step, len(timesteps)):
        t = timesteps[index]
        start = timer.mark()
        local = exchange.local_branches(names)
        if pipeline is not None:
            pipeline.step(index)
        if pipeline is not None and not pipeline.synchronous(index):
            latents = patch_step(family, pipe, trajectory, conditioning, exchange, pipeline, latents, index)
            was_async = True
        else:
            if was_async:  # a synchronous step after asynchronous ones: every stage takes the whole latent
                latents, was_async = resync(pipeline, pipe, latents, latents.device), False
            predictions = {}
            for name in local:
                with (cache.branch(name, index) if cache is not None else nullcontext(),
                      stale.branch(name, index) if stale is not None else nullcontext()):
                    predictions[name] = family.predict(pipe, trajectory, latents, t, index,
                                                       conditioning.branches[name])
            predictions = exchange.complete(predictions, names)
            noise = family.combine(predictions, conditioning.guidance_scale, t)
            latents = pipe.scheduler.step(noise, t, latents, return_dict=False)[0]
        end = timer.mark()
        extra = step_extra() if step_extra else {}
        if cache is not None:
            extra.update(cache.step_columns(len(local) < len(names), cfg, latents.device))
        timer.add("denoise_step", start, end, step=index, **extra)
        steps_done = index + 1
        if after_step is not None and after_step(steps_done, latents) and steps_done < len(timesteps):
            if pipeline is not None:
                latents = finish(pipeline, latents, stopped=True)
            return DenoiseResult(latents=latents, steps_done=steps_done, stopped=True)
    if pipeline is not None:
        latents = finish(pipeline, latents, stopped=False)
    return DenoiseResult(latents=latents, steps_done=steps_done, stopped=False)
