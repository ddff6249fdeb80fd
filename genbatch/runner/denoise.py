"""The denoise loop: one family-agnostic loop with timed steps, CFG exchange and step-boundary control.

    for each remaining timestep:
        predict this rank's guidance branches   (sequence parallel happens inside the transformer)
        exchange branch predictions             (CFG parallel: one exchange of the prediction per step)
        combine, scheduler.step                  -> new latents (identical on every rank of the group)
        after_step(step, latents)               -> checkpoint / stop at this boundary

The order of operations is the diffusers pipeline's own, so the result equals the pipeline's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from genbatch.models.hooks import Conditioning, Family, Trajectory
from genbatch.parallel.cfg import BranchExchange
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
) -> DenoiseResult:
    """Run the denoising steps from `start_step` (0, or a checkpoint's `steps_done`)."""
    latents = trajectory.latents if latents is None else latents
    names = list(conditioning.branches)
    timesteps = trajectory.timesteps
    steps_done = start_step
    for index in range(start_step, len(timesteps)):
        t = timesteps[index]
        start = timer.mark()
        local = exchange.local_branches(names)
        predictions = {
            name: family.predict(pipe, trajectory, latents, t, index, conditioning.branches[name]) for name in local
        }
        predictions = exchange.complete(predictions, names)
        noise = family.combine(predictions, conditioning.guidance_scale, t)
        latents = pipe.scheduler.step(noise, t, latents, return_dict=False)[0]
        timer.add("denoise_step", start, timer.mark(), step=index, **(step_extra() if step_extra else {}))
        steps_done = index + 1
        if after_step is not None and after_step(steps_done, latents) and steps_done < len(timesteps):
            return DenoiseResult(latents=latents, steps_done=steps_done, stopped=True)
    return DenoiseResult(latents=latents, steps_done=steps_done, stopped=False)
