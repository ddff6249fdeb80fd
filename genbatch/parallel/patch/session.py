"""One job's stale attention: a `StaleState` per denoiser, set when the job starts, dropped when it ends.

    session = StaleSession.start(pipe, spec, config)     a fresh state on each denoiser's patch strategies
    with session.branch("cond", step):                    the forward's buffers and whether it is synchronous
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

from genbatch.jobs.models import ModelSpec
from genbatch.models import family
from genbatch.parallel.patch.config import StaleConfig
from genbatch.parallel.patch.state import StaleState
from genbatch.parallel.sequence import SEQUENCE_PARALLEL


def patch_strategies(model: torch.nn.Module) -> list:
    """The stale-K/V strategies routing `model`'s attention (none when it is not patch parallel)."""
    parallel = getattr(model, SEQUENCE_PARALLEL, None)
    if parallel is None:
        return []
    return [strategy for strategy in parallel.strategies.values() if hasattr(strategy, "state")]


@dataclass(kw_only=True, slots=True)
class StaleSession:
    config: StaleConfig | None
    """The run's approximation (None: exact, the session does nothing)."""
    states: list[tuple[list, StaleState]] = field(default_factory=list)
    """Each denoiser's strategies and the state they share."""

    @classmethod
    def start(cls, pipe, spec: ModelSpec, config: StaleConfig | None, extra_sync: frozenset[int] = frozenset()
              ) -> StaleSession:
        """A fresh state on every denoiser of the pipeline; `extra_sync`: further synchronous steps (the
        reference of a resumed run: the steps its resume re-warmed)."""
        session = cls(config=config)
        if config is None:
            return session
        for name in family(spec.family).denoisers:
            model = getattr(pipe, name, None)
            strategies = patch_strategies(model) if model is not None else []
            if not strategies:
                continue
            state = StaleState(method=config.method, warmup_steps=config.warmup_steps, extra_sync=frozenset(extra_sync))
            for strategy in strategies:
                strategy.state = state
            session.states.append((strategies, state))
        return session

    @contextlib.contextmanager
    def branch(self, name: str, step: int):
        """Run a denoiser forward of branch `name` at step index `step`."""
        for _, state in self.states:
            state.arm(name, step)
        yield

    def held_bytes(self) -> int:
        """The bytes of K/V the buffers hold now, over every denoiser."""
        return sum(state.held_bytes() for _, state in self.states)

    def peak_bytes(self) -> int:
        """The most K/V bytes any denoiser's buffers held at once in this job."""
        return max((state.peak_bytes for _, state in self.states), default=0)

    def close(self) -> None:
        for strategies, state in self.states:
            state.clear()
            for strategy in strategies:
                strategy.state = None
        self.states.clear()
