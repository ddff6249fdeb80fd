"""One job's stale attention (DistriFusion): a `StaleState` per denoiser, set when the job starts, dropped when
it ends; the feature's `JobHook`.

    session = StaleSession.start(pipe, spec, config)     a fresh state on each denoiser's patch strategies
    with session.branch("cond", step, None):              the forward's buffers and whether it is synchronous
        prediction = transformer(...)
    session.held_bytes()                                  the K/V the buffers hold now (measured, per rank)
    session.close()                                       buffers dropped: the next job starts empty

A resumed job starts a new session: its buffers are empty, so it re-warms for `warmup_steps` steps (the K/V
buffers are not checkpointed; the checkpoint is the whole latent, which every patch rank holds after each step).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from genbatch.models.spec import ModelSpec
from genbatch.models import family
from genbatch.parallel.attention.stateful import StatefulAttention
from genbatch.parallel.job_hooks import JobHook, JobStart
from genbatch.parallel.stale import DISTRIFUSION, StaleConfig
from genbatch.parallel.patch.state import StaleState
from genbatch.parallel.sequence import SEQUENCE_PARALLEL

STALE_BYTES = "stale_peak_bytes"
"""The summary's entry: the most stale K/V bytes this rank's buffers held at once in the job."""


def stateful_strategies(model: torch.nn.Module | None) -> list[StatefulAttention]:
    """The stale-K/V strategies routing `model`'s attention (none when it is not sequence parallel)."""
    parallel = SEQUENCE_PARALLEL.get(model)
    if parallel is None:
        return []
    return [strategy for strategy in parallel.strategies.values() if isinstance(strategy, StatefulAttention)]


@dataclass(kw_only=True, slots=True)
class StaleSession(JobHook):
    config: StaleConfig
    """The run's approximation."""
    states: list[tuple[list, StaleState]] = field(default_factory=list)
    """Each denoiser's strategies and the state they share."""

    @classmethod
    def start(cls, pipe, spec: ModelSpec, config: StaleConfig, extra_sync: frozenset[int] = frozenset()
              ) -> StaleSession:
        """A fresh state on every denoiser of the pipeline; `extra_sync`: further synchronous steps (the
        reference of a resumed run: the steps its resume re-warmed)."""
        session = cls(config=config)
        for name in family(spec.family).denoisers:
            strategies = stateful_strategies(getattr(pipe, name, None))
            if not strategies:
                continue
            state = StaleState(method=config.method, warmup_steps=config.warmup_steps, extra_sync=frozenset(extra_sync))
            for strategy in strategies:
                strategy.state = state
            session.states.append((strategies, state))
        return session

    @contextlib.contextmanager
    def branch(self, name: str, index: int, patch: int | None = None):
        """Run a denoiser forward of branch `name` at step index `index`."""
        for _, state in self.states:
            state.arm(name, index)
        yield

    def held_bytes(self) -> int:
        """The bytes of K/V the buffers hold now, over every denoiser."""
        return sum(state.held_bytes() for _, state in self.states)

    def peak_bytes(self) -> int:
        """The most K/V bytes any denoiser's buffers held at once in this job."""
        return max((state.peak_bytes for _, state in self.states), default=0)

    def summary(self) -> dict:
        return {STALE_BYTES: self.peak_bytes()}

    def close(self) -> None:
        for strategies, state in self.states:
            state.clear()
            for strategy in strategies:
                strategy.state = None
        self.states.clear()


def start_job(start: JobStart) -> StaleSession | None:
    """DistriFusion's (and the naive-patch baseline's, off the pp axis) session for the job; None under exact
    attention or PipeFusion. Each expert's buffers re-warm on their first use."""
    config = start.run.stale
    if config is None or (config.method != DISTRIFUSION and start.ctx.dims.pp > 1):
        return None
    return StaleSession.start(start.pipe, start.spec, config, extra_sync=start.run.resync_steps)
