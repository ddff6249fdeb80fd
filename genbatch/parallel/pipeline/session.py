"""One job's PipeFusion: a `PipeState` per denoiser, shared by its attention strategy, patch hooks and stage
link; which steps are synchronous; the per-patch schedulers of the asynchronous steps. It is the feature's
`JobHook`: it runs the asynchronous steps itself (`genbatch.parallel.pipeline.steps`).

    session = PipeSession.start(pipe, spec, config, comm, image_grids(start), start_step)
                                                 the grids: the noise's, then an input image's (edit models)
    session.synchronous(index)                   the first `warmup_steps` steps of the job (and of a resumed
                                                 job, which starts a new session), and `extra_sync`
    with session.branch("cond", index, patch):   one forward of a branch, on a patch (None: whole)
    session.schedulers(pipe.scheduler, latents)  the per-patch schedulers (made at the first asynchronous step)
    session.close()                              buffers dropped

The K/V buffers are not checkpointed: a resumed job re-warms for `warmup_steps` steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from genbatch.models.hooks import TokenGrid
from genbatch.models.spec import ModelSpec
from genbatch.models import family
from genbatch.parallel.comm import Comm
from genbatch.parallel.job_hooks import DenoiseSteps, JobHook, JobStart
from genbatch.parallel.stale import DISTRIFUSION, NAIVE_PATCH, StaleConfig
from genbatch.parallel.patch.session import STALE_BYTES, stateful_strategies
from genbatch.parallel.pipeline import steps as pipeline_steps
from genbatch.parallel.pipeline.patches import PATCHES
from genbatch.parallel.pipeline.regions import PatchSchedulers, region_masks
from genbatch.parallel.pipeline.stages import PIPELINE, StageLink
from genbatch.parallel.pipeline.state import PipeState
from genbatch.parallel.sequence import SEQUENCE_PARALLEL


def row_tokens(spec: ModelSpec, width: int) -> int:
    """Tokens in one row of a job's latent: its width over the VAE's and the patch's downsampling."""
    return width // (spec.vae_spatial * spec.patch_size[-1])


def image_grids(start: JobStart) -> tuple[TokenGrid, ...]:
    """The job's image stream, grid by grid: the output's noise, then what the family says follows it (a
    conditioning image's tokens: `FamilyHooks.conditioning_grids`)."""
    job, spec = start.job, start.spec
    noise = TokenGrid(tokens=spec.tokens(job.width, job.height, job.num_frames), row_tokens=row_tokens(spec, job.width))
    return (noise, *start.family_hooks.conditioning_grids(start.pipe, start.trajectory))


def switch_steps(family, pipe, trajectory) -> list[int]:
    """The step indices at which the family's denoiser changes (Wan 2.2's second expert takes over): the other
    expert's K/V buffers are empty there, so PipeFusion re-warms from each."""
    models = [family.denoiser_at(pipe, trajectory, t) for t in trajectory.timesteps]
    return [index for index in range(1, len(models)) if models[index] is not models[index - 1]]


def patch_problem(spec: ModelSpec, width: int, height: int, num_frames: int | None, patches: int) -> str | None:
    """Why a job of this size cannot be split into `patches` patches of whole token rows (None: it can)."""
    rows = spec.tokens(width, height, num_frames) // row_tokens(spec, width)
    if rows >= patches:
        return None
    return (f"its latent has {rows} token rows, too few for --patches {patches} (each patch holds whole rows); "
            f"use --patches {rows} or fewer, or a taller size")


@dataclass(kw_only=True, slots=True)
class PipeSession(JobHook):
    config: StaleConfig
    """The run's PipeFusion settings (its patches and warm-up steps)."""
    first_step: int = 0
    """The job's first step in this session (a resumed job's checkpointed step)."""
    extra_sync: frozenset[int] = frozenset()
    """Further synchronous steps (the reference of a resumed run)."""
    parts: list[tuple[PipeState, list]] = field(default_factory=list)
    """Each denoiser's state and the objects that read it (its strategies, patch hooks, stage link)."""
    links: list[StageLink] = field(default_factory=list)
    """The denoisers' stage links (their sends in flight are waited for at the end)."""
    spec: ModelSpec | None = None
    """The job's model."""
    comm: Comm | None = None
    """The pp group: stage 0 is its rank 0."""
    patch_schedulers: PatchSchedulers | None = None
    pending: bool = False
    """True when the last stage sent this step's patch latents to the first stage (it receives them next step)."""
    sends: dict[int, tuple] = field(default_factory=dict)
    """The last stage's sends of patch latents in flight: patch -> (work, tensor)."""
    was_async: bool = False
    """The step before ran one forward per patch (a synchronous step after it first resyncs every stage)."""

    @classmethod
    def start(cls, pipe, spec: ModelSpec, config: StaleConfig, comm, grids: tuple[TokenGrid, ...],
              start_step: int = 0, extra_sync: frozenset[int] = frozenset()) -> PipeSession:
        """A fresh state on each denoiser for a job whose image stream holds `grids` (`image_grids`: the
        output's noise first), resumed at `start_step`; `comm`: the pp group."""
        session = cls(config=config, first_step=start_step, extra_sync=frozenset(extra_sync), spec=spec, comm=comm)
        record = family(spec.family)
        for name in record.denoisers:
            model = getattr(pipe, name, None)
            parallel = SEQUENCE_PARALLEL.get(model)
            if parallel is None:
                continue
            text = frozenset(parallel.routing.text_streams)
            state = PipeState(patches=config.patches, grids=tuple(grids), text_streams=text,
                              naive=config.method == NAIVE_PATCH)
            link = PIPELINE.get(model)
            readers = [*stateful_strategies(model), *filter(None, (PATCHES.get(model), link))]
            for reader in readers:
                reader.state = state
            session.parts.append((state, readers))
            if link is not None:
                session.links.append(link)
        return session

    def synchronous(self, index: int) -> bool:
        """Whether step `index` runs whole forwards (exact) rather than one forward per patch."""
        return index < self.first_step + self.config.warmup_steps or index in self.extra_sync

    def begin_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor:
        synchronous = self.synchronous(index)
        for state, _ in self.parts:
            state.sync = synchronous
        if synchronous and self.was_async:  # every stage takes the whole latent
            self.was_async = False
            return pipeline_steps.resync(self, steps.pipe, latents, latents.device)
        return latents

    def run_step(self, steps: DenoiseSteps, latents: torch.Tensor, index: int) -> torch.Tensor | None:
        if self.synchronous(index):
            return None  # the loop's whole step: whole forwards on every stage
        self.was_async = True
        return pipeline_steps.patch_step(steps, self, latents, index)

    def end(self, steps: DenoiseSteps, latents: torch.Tensor, stopped: bool) -> torch.Tensor:
        return pipeline_steps.finish(self, latents, stopped=stopped)

    @contextlib.contextmanager
    def branch(self, name: str, index: int, patch: int | None = None):
        """One forward of branch `name`, on `patch` (None: a whole forward, a synchronous step)."""
        for state, _ in self.parts:
            state.begin(name, patch)
        try:
            yield
        finally:
            for state, _ in self.parts:
                state.patch = None

    def schedulers(self, scheduler, latents: torch.Tensor) -> PatchSchedulers:
        """The per-patch schedulers, copied from `scheduler` at the first asynchronous step."""
        if self.patch_schedulers is None:
            state = self.parts[0][0]
            # each patch's range of the noise grid (the stream's first): the latent's tokens
            ranges = [state.patch_ranges(patch)[0] for patch in range(self.config.patches)]
            self.patch_schedulers = PatchSchedulers(scheduler, region_masks(latents, self.spec.patch_size, ranges))
        return self.patch_schedulers

    def peak_bytes(self) -> int:
        return self.held_bytes()

    def summary(self) -> dict:
        return {STALE_BYTES: self.peak_bytes()}

    def held_bytes(self) -> int:
        return sum(state.held_bytes() for state, _ in self.parts)

    def wait_send(self, patch: int) -> None:
        """Wait for the send in flight of `patch`'s latent part, if any."""
        sent = self.sends.pop(patch, None)
        if sent is not None:
            sent[0].wait()

    def flush(self) -> None:
        """Wait for this rank's sends in flight: the patch latents, and each stage link's activations."""
        for patch in list(self.sends):
            self.wait_send(patch)
        for link in self.links:
            link.flush()

    def close(self) -> None:
        self.flush()
        for state, readers in self.parts:
            state.clear()
            for reader in readers:
                reader.state = None
        self.parts.clear()
        self.links.clear()
        self.patch_schedulers = None


def start_job(start: JobStart) -> PipeSession | None:
    """PipeFusion's session for the job (its pp stages' states; re-warming where Wan 2.2's second expert takes
    over); None off the pp axis or under DistriFusion."""
    config = start.run.stale
    if config is None or config.method == DISTRIFUSION or start.ctx.dims.pp == 1:
        return None
    rewarm = {index + offset for index in switch_steps(start.family_hooks, start.pipe, start.trajectory)
              for offset in range(config.warmup_steps)}
    return PipeSession.start(start.pipe, start.spec, config, start.ctx.pp_comm, image_grids(start),
                             start_step=start.start_step, extra_sync=start.run.resync_steps | rewarm)
