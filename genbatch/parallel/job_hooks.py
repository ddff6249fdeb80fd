"""The per-job hook protocol: how a feature that lives for one job takes part in its denoise loop.

Step caching, DistriFusion's stale K/V and PipeFusion's patch pipeline each start a `JobHook` when a job
starts (`genbatch.parallel.features.start_hooks`) and the loop (`genbatch.runner.denoise`) holds them in a
`JobHooks`, closed by an ExitStack however the job ends. The loop never asks which feature a hook is:

    hooks.begin_step(steps, latents, i)     each hook, in order, may take the latents (PipeFusion's resync)
    hooks.run_step(steps, latents, i)       the first hook that runs the step itself (PipeFusion's patch
                                            steps); None from every hook: the loop runs the whole step, each
                                            branch's forward inside every hook's `branch` context
    hooks.step_columns(split)               the step's timing columns (the cache's skipped count)
    hooks.end(steps, latents, stopped)      each hook, in order, may take the final latents (PipeFusion: the
                                            sends in flight, the last stage's latent)
    hooks.summary()                         what the job's hooks measured (the loop's caller keeps it)
    hooks.close()                           every hook's close, in reverse order (an ExitStack)

Every method of `JobHook` has a default that does nothing, so a hook states only what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models.hooks import Conditioning, FamilyHooks, Trajectory
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.comm import Comm
from genbatch.parallel.context import ParallelContext
from genbatch.parallel.stale import StaleConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class DenoiseSteps:
    """What a step is made from: a job's model, its trajectory and conditioning, and the CFG exchange; handed
    to the hooks that run steps themselves."""

    family_hooks: FamilyHooks
    pipe: object
    trajectory: Trajectory
    conditioning: Conditioning
    exchange: BranchExchange
    hooks: JobHooks

    @property
    def branches(self) -> list[str]:
        """Every guidance branch of the job, in order."""
        return list(self.conditioning.branches)

    def predict(self, latents: torch.Tensor, index: int, branch: str, patch: int | None = None) -> torch.Tensor:
        """One denoiser forward of `branch` at step `index` (on `patch` of the latent; None: whole), inside
        every hook's context for it."""
        with self.hooks.branch(branch, index, patch):
            return self.family_hooks.predict(self.pipe, self.trajectory, latents, self.trajectory.timesteps[index], index,
                                       self.conditioning.branches[branch])

    def combine(self, predictions: dict[str, torch.Tensor], index: int, latents: torch.Tensor) -> torch.Tensor:
        """This rank's branch predictions -> every branch's (the CFG exchange) -> the guided noise (`latents`: what
        step `index` started from; `FamilyHooks.guide`)."""
        predictions = self.exchange.complete(predictions, self.branches)
        return self.family_hooks.guide(self.pipe, self.trajectory, predictions, self.conditioning.guidance_scale, latents,
                                 index)

    def whole_step(self, latents: torch.Tensor, index: int) -> torch.Tensor:
        """One step over the whole latent: this rank's branches, the exchange, the scheduler's step."""
        predictions = {name: self.predict(latents, index, name) for name in self.exchange.local_branches(self.branches)}
        noise = self.combine(predictions, index, latents)
        return self.pipe.scheduler.step(noise, self.trajectory.timesteps[index], latents, return_dict=False)[0]


class JobHook:
    """One feature's part in one job's denoise loop (the defaults do nothing)."""

    def begin_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor:
        """Before step `index`: the latents the step starts from."""
        return latents

    def run_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor | None:
        """Run step `index` in this hook's own way and return the new latents; None: the loop's whole step."""
        return None

    def branch(self, name: str, index: int, patch: int | None) -> AbstractContextManager:
        """The context of one denoiser forward of branch `name` at step `index` (`patch`: None, a whole one)."""
        return nullcontext()

    def step_columns(self, split: bool) -> dict[str, int]:
        """The finished step's timing columns; `split`: this rank ran only some of the branches (CFG parallel)."""
        return {}

    def end(self, steps: DenoiseSteps, latents: torch.Tensor, stopped: bool) -> torch.Tensor:
        """After the last step this job runs here (`stopped`: asked to stop early): the final latents."""
        return latents

    def summary(self) -> dict:
        """What this hook measured over the job, for the caller to keep."""
        return {}

    def close(self) -> None:
        """Drop the job's state (the next job starts empty)."""


class JobHooks:
    """One job's hooks, in order, closed together (in reverse order) by `close` or on leaving a `with`."""

    def __init__(self, hooks: Sequence[JobHook] = ()):
        self.hooks = list(hooks)
        self._stack = ExitStack()
        for hook in self.hooks:
            self._stack.callback(hook.close)

    @classmethod
    def start(cls, starters: Sequence[Callable[[], JobHook | None]]) -> JobHooks:
        """Start each hook in order (a starter returning None: that feature is off for the job); if one fails,
        those already started are closed before the error goes on."""
        hooks = cls()
        try:
            for starter in starters:
                hook = starter()
                if hook is not None:
                    hooks.add(hook)
        except BaseException:
            hooks.close()
            raise
        return hooks

    def add(self, hook: JobHook) -> None:
        self.hooks.append(hook)
        self._stack.callback(hook.close)

    def __enter__(self) -> JobHooks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    def begin_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor:
        for hook in self.hooks:
            latents = hook.begin_step(steps, latents, index)
        return latents

    def run_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor | None:
        for hook in self.hooks:
            stepped = hook.run_step(steps, latents, index)
            if stepped is not None:
                return stepped
        return None

    @contextmanager
    def branch(self, name: str, index: int, patch: int | None = None) -> Iterator[None]:
        with ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.branch(name, index, patch))
            yield

    def step_columns(self, split: bool) -> dict[str, int]:
        columns: dict[str, int] = {}
        for hook in self.hooks:
            columns.update(hook.step_columns(split))
        return columns

    def end(self, steps: DenoiseSteps, latents: torch.Tensor, stopped: bool) -> torch.Tensor:
        for hook in self.hooks:
            latents = hook.end(steps, latents, stopped)
        return latents

    def summary(self) -> dict:
        merged: dict = {}
        for hook in self.hooks:
            merged.update(hook.summary())
        return merged


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFeatures:
    """The run's settings of its per-job features, the same for every job of the run."""

    stale: StaleConfig | None = None
    """The run's stale-K/V attention (`--distrifusion`, `--pipefusion`; None: exact)."""
    resync_steps: frozenset[int] = frozenset()
    """Steps that run synchronously under `stale` besides each job's warm-up (the uninterrupted reference of a
    resumed job, whose resume re-warmed at these steps)."""
    cache_group: Comm | None = None
    """The ranks that agree on each step-cache decision (`genbatch.parallel.cache.agreement.decision_comm`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobStart:
    """What a feature may read when a job starts, to decide whether it takes part and to set itself up."""

    job: JobSpec
    spec: ModelSpec
    family_hooks: FamilyHooks
    pipe: object
    trajectory: Trajectory
    start_step: int
    """The job's first step here (a resumed job's checkpointed step; 0 otherwise)."""
    ctx: ParallelContext
    """The rank's groups."""
    run: RunFeatures
    """The run's settings of the per-job features."""
