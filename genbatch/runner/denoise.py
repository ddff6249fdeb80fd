"""The denoise loop: one family-agnostic loop with timed steps, CFG exchange and step-boundary control.

    for each remaining timestep:
        hooks.begin_step                         each per-job feature's set-up of the step
        hooks.run_step, or the whole step:       a feature that runs the step itself (PipeFusion's patch
            predict this rank's branches         steps), else each branch's forward inside every hook's
            exchange, combine, scheduler.step    context (sequence parallel happens inside the transformer;
                                                 CFG parallel: one exchange of the prediction per step)
        time the step                            (with the hooks' columns: the step cache's skipped count)
        after_step(step, latents)               -> checkpoint / stop at this boundary
    hooks.end                                    the features' final latents (PipeFusion's last transfers)

The loop holds the job's hooks (`genbatch.parallel.job_hooks`) and never asks which feature one is. The order
of operations is the diffusers pipeline's own, so the result equals the pipeline's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from genbatch.models.hooks import Conditioning, FamilyHooks, Trajectory
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.job_hooks import DenoiseSteps, JobHooks
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
    family_hooks: FamilyHooks,
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
    hooks: JobHooks | None = None,
) -> DenoiseResult:
    """Run the denoising steps from `start_step` (0, or a checkpoint's `steps_done`) with the job's `hooks`
    (None: none; the caller closes them)."""
    hooks = hooks if hooks is not None else JobHooks()
    steps = DenoiseSteps(family_hooks=family_hooks, pipe=pipe, trajectory=trajectory, conditioning=conditioning,
                         exchange=exchange, hooks=hooks)
    latents = trajectory.latents if latents is None else latents
    total = len(trajectory.timesteps)
    split = len(exchange.local_branches(steps.branches)) < len(steps.branches)
    steps_done = start_step
    for index in range(start_step, total):
        start = timer.mark()
        latents = hooks.begin_step(steps, latents, index)
        stepped = hooks.run_step(steps, latents, index)
        latents = stepped if stepped is not None else steps.whole_step(latents, index)
        end = timer.mark()
        extra = step_extra() if step_extra else {}
        extra.update(hooks.step_columns(split))
        timer.add("denoise_step", start, end, step=index, **extra)
        steps_done = index + 1
        if after_step is not None and after_step(steps_done, latents) and steps_done < total:
            return DenoiseResult(latents=hooks.end(steps, latents, stopped=True), steps_done=steps_done, stopped=True)
    latents = family_hooks.finish(pipe, trajectory, hooks.end(steps, latents, stopped=False))
    return DenoiseResult(latents=latents, steps_done=steps_done, stopped=False)
