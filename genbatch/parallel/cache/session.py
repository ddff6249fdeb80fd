"""One job's step cache: hooks installed when the job starts, removed when it ends.

    cache = StepCache.start(pipe, spec, mode, comm,    hooks on every denoiser (Wan 2.2: both experts,
                            steps=len(timesteps))      each with its own state); TeaCache: the model's
                                                       published coefficients (an uncovered model: ValueError)
    with cache.branch("cond", step):                   diffusers' cache context of that name on every
        prediction = transformer(...)                  denoiser: each guidance branch keeps its own state
    cache.step_columns(split)                          {"cache_skipped": forwards of the step that reused
                                                       cached work, over every branch}, the same on every
                                                       rank of the group
    cache.close()                                      hooks removed: the next job starts from empty state

`start_job` is the feature's `JobHook` starter (`genbatch.parallel.job_hooks`): a job whose mode is none gets
no hook. A resumed job starts a new `StepCache`: its state is empty, so its first step computes in full (the cached
residuals are not checkpointed). `mode` none installs nothing and costs nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from genbatch.jobs.cache import FBC, TAYLORSEER, TEACACHE, CacheMode, parse_cache
from genbatch.models.spec import ModelSpec
from genbatch.models import family
from genbatch.models.teacache import covered_model, not_covered
from genbatch.parallel.cache import fbc, taylorseer, teacache
from genbatch.parallel.comm import Comm
from genbatch.parallel.job_hooks import JobHook, JobStart

SKIPPED = "cache_skipped"
"""The step timing column: how many branch forwards of the step reused cached work (0: all computed)."""


def _transformer_parts(spec: ModelSpec, model: torch.nn.Module):
    """The family's parts of `model`'s class (or the first class it derives from: FSDP2 subclasses each one)."""
    record = family(spec.family)
    for cls in type(model).__mro__:
        if cls.__name__ in record.transformers:
            return record.transformer_parts(cls.__name__)
    return record.transformer_parts(type(model).__name__)  # raises, naming the known classes


def _teacache_model(spec: ModelSpec, models: list[torch.nn.Module]):
    """The covered model the job's denoisers are (by the first one's class and config); ValueError naming the
    covered models when they are none of them."""
    config = dict(models[0].config) if models else {}
    names = [cls.__name__ for cls in type(models[0]).__mro__] if models else []
    found = next(filter(None, (covered_model(name, config, len(models)) for name in names)), None)
    if found is None:
        raise ValueError(not_covered(spec.name))
    return found


@dataclass(kw_only=True, slots=True)
class StepCache(JobHook):
    """The step cache of one job on one rank."""

    mode: CacheMode
    """The job's mode."""
    cfg: Comm | None = None
    """The cfg group the per-step skipped count is summed over under CFG parallel (None: no sum)."""
    device: torch.device = torch.device("cpu")
    """Where that sum's tensor lives (the group's device)."""
    models: list[torch.nn.Module] = field(default_factory=list)
    """The hooked denoisers."""
    hooked: int = 0
    """Modules (FBC: blocks; TaylorSeer: attention and feed-forward modules) carrying a cache hook."""
    indicators: list[tuple[int, str, float | None]] = field(default_factory=list)
    """FBC: (step, branch, agreed relative L1) of every head-block forward; TeaCache: (step, branch, the
    accumulated rescaled change the step decided on). None: a step that computes without comparing (the
    first; TeaCache's warm-up and last steps)."""
    _branch: str | None = None
    _step: int = 0
    _skipped: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, pipe, spec: ModelSpec, mode: CacheMode, comm: Comm, steps: int = 0, cfg: Comm | None = None,
              device: torch.device = torch.device("cpu")) -> StepCache:
        """Install `mode`'s hooks on the pipeline's denoisers of a job of `steps` steps (TeaCache computes the
        last one in full; 0: every step); FBC and TeaCache decide over `comm` (`decision_comm`); the skipped
        count of a step is summed over `cfg` when this rank ran only its own branch."""
        from diffusers.hooks.hooks import HookRegistry

        from genbatch.parallel.apply import denoisers

        cache = cls(mode=mode, cfg=cfg, device=device)
        if not mode.enabled:
            return cache
        models = [model for model in (getattr(pipe, name, None) for name in denoisers(spec)) if model is not None]
        covered = _teacache_model(spec, models) if mode.kind == TEACACHE else None
        try:
            for model in models:
                parts = _transformer_parts(spec, model)
                lists = parts.cache_lists or parts.blocks.repeated
                if mode.kind == FBC:
                    cache.hooked += fbc.install(model, lists, mode.threshold, comm, cache._report_decision)
                elif mode.kind == TAYLORSEER:
                    patterns = tuple(site.pattern for site in parts.attention)
                    cache.hooked += taylorseer.install(model, patterns, lists, mode.interval, cache._report)
                elif mode.kind == TEACACHE:
                    cache.hooked += teacache.install(model, lists, covered, mode.threshold, steps, comm,
                                                     cache._report_decision)
                HookRegistry.check_if_exists_or_initialize(model).invalidate_child_registries_cache()
                cache.models.append(model)
        except Exception:
            cache.close()  # a denoiser refused (Wan 2.2: the second expert): none keeps a hook
            raise
        return cache

    def _report(self, computed: bool) -> None:
        if not computed:
            self._skipped.add(self._branch)

    def _report_decision(self, computed: bool, indicator: float | None) -> None:
        self.indicators.append((self._step, self._branch, indicator))
        self._report(computed)

    @contextlib.contextmanager
    def branch(self, name: str, step: int, patch: int | None = None):
        """Run a denoiser call of branch `name` at step index `step` in that branch's cache context (diffusers'
        `cache_context`, set directly: SD3's transformer lacks the mixin that offers it)."""
        if not self.models:
            yield
            return
        from diffusers.hooks.hooks import CacheContext, _set_cache_context

        self._branch, self._step = name, step
        context = CacheContext(name, step_index=step)
        for model in self.models:
            _set_cache_context(model, context)
        try:
            yield
        finally:
            for model in self.models:
                _set_cache_context(model, None)

    def step_columns(self, split: bool) -> dict[str, int]:
        """The finished step's timing columns ({} without caching). `split`: this rank ran only its own cfg
        branch (CFG parallel), so the count is summed over the cfg group (one small all-reduce)."""
        if not self.mode.enabled:
            return {}
        skipped = len(self._skipped)
        self._skipped.clear()
        cfg = self.cfg
        if split and cfg is not None and cfg.size > 1:
            total = torch.tensor([skipped], dtype=torch.int64, device=self.device)
            cfg.all_reduce(total, op=dist.ReduceOp.SUM, kind="control")
            skipped = int(total.item())
        return {SKIPPED: skipped}

    def close(self) -> None:
        """Remove the hooks (and with them every cached tensor)."""
        from diffusers.hooks.hooks import HookRegistry

        names = {FBC: fbc.HOOK_NAMES, TAYLORSEER: taylorseer.HOOK_NAMES}.get(self.mode.kind, teacache.HOOK_NAMES)
        for model in self.models:
            if self.mode.kind == TAYLORSEER and taylorseer.disarm(model):
                continue  # inside compiled blocks: kept, passing through until a job arms them again
            registry = HookRegistry.check_if_exists_or_initialize(model)
            for name in names:
                registry.remove_hook(name, recurse=True)
            registry.invalidate_child_registries_cache()
        self.models.clear()

    def summary(self) -> dict:
        """The job's decision indicators (`cache_indicators`) and how many modules carried a hook
        (`cache_hooked`)."""
        return {"cache_indicators": list(self.indicators), "cache_hooked": self.hooked}


def start_job(start: JobStart) -> StepCache | None:
    """The job's step cache (None: its mode is none). A resumed job starts empty: its first step computes."""
    mode = parse_cache(start.job.cache)
    if not mode.enabled:
        return None
    return StepCache.start(start.pipe, start.spec, mode, start.run.cache_group, steps=len(start.trajectory.timesteps),
                           cfg=start.ctx.cfg, device=start.ctx.device)
