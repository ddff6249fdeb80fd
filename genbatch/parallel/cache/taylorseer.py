"""TaylorSeer on the family's own modules (diffusers' hooks, with genbatch's module choice).

diffusers' default patterns (`^blocks.*attn`, `^transformer_blocks.*attn`, fullmatched) match no module of
Wan (`blocks.N.attn1` / `attn2`), so TaylorSeer silently does nothing there. genbatch hooks what the family's
parts name instead: every attention module of its `AttentionSite`s, and every diffusers `FeedForward`
inside the repeated blocks. `install` returns how many modules it hooked (a model with none is refused).

Those modules live inside the blocks, whose forwards `--compile` compiles. With `--cache taylorseer:N` given to
the run, the blocks compile with room for graph breaks (`CompileConfig.breaks`) and each hooked module's call
runs eagerly between the compiled parts of its block (`torch.compiler.disable`: its Python state, the step
count and the Taylor factors, never enters a graph). Those hooks are installed once per model and kept across
jobs: installing new ones per job would change what the compiled blocks call and recompile them every job; a
later job re-arms them with its interval and empty state, and a job without TaylorSeer finds them passing its
calls straight through. Blocks compiled whole (`--compile` without a run-level TaylorSeer) refuse a row that
asks for it (its job fails, naming the fix); `fbc`, whose hooks wrap the compiled blocks from outside, runs there.

Its schedule depends on the step count alone (three warm-up steps, then one full step in every `interval`),
and every rank counts the same steps, so the ranks of a group agree without a collective.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

import torch
from diffusers.hooks.hooks import HookRegistry, StateManager
from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK, TaylorSeerCacheHook, TaylorSeerState
from diffusers.models.attention import FeedForward

from genbatch.parallel.compile import COMPILED
from genbatch.parallel.marks import ModuleMark

HOOK_NAMES = (_TAYLORSEER_CACHE_HOOK,)
"""The registry name of the hooks `install` adds."""
WARMUP_STEPS = 3
"""Full steps before the first prediction (diffusers' default: two are needed for a first-order factor)."""
ORDER = 1
"""The Taylor expansion's order (diffusers' default)."""

Report = Callable[[bool], None]
"""Called with `computed` at every hooked module's forward."""


class ReportingHook(TaylorSeerCacheHook):
    """diffusers' TaylorSeer hook, telling the job's `StepCache` whether this step computes."""

    def __init__(self, *, report: Report, **kwargs):
        super().__init__(**kwargs)
        self.report = report

    @torch.compiler.disable
    def _measure_should_compute(self):
        should_compute, state = super()._measure_should_compute()
        self.report(should_compute)
        return should_compute, state


def cached_modules(model: torch.nn.Module, attention: tuple[str, ...], lists: tuple[str, ...]
                   ) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of the modules TaylorSeer predicts: those matching an attention pattern (globs), and
    the feed-forward modules inside the repeated lists."""
    found = []
    for name, module in model.named_modules():
        in_blocks = any(name.startswith(f"{blocks}.") for blocks in lists)
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in attention) or (
                in_blocks and isinstance(module, FeedForward)):
            found.append((name, module))
    return found


class EagerReportingHook(ReportingHook):
    """`ReportingHook` inside compiled blocks: its whole call runs eagerly; kept across jobs, and while no job
    arms it (`active` False) it passes each call straight to the module's own forward."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.active = True

    @torch.compiler.disable
    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        if not self.active:
            return self.fn_ref.original_forward(*args, **kwargs)
        return super().new_forward(module, *args, **kwargs)


KEPT: ModuleMark[list] = ModuleMark("taylorseer hooks kept")
"""A model with compiled blocks: its TaylorSeer hooks, kept between jobs as (module, hook) pairs."""


def _blocks(model: torch.nn.Module, lists: tuple[str, ...]) -> list[torch.nn.Module]:
    return [block for name in lists for block in model.get_submodule(name)]


def disarm(model: torch.nn.Module) -> bool:
    """Set a model's kept hooks passing through (the job ended); False when it keeps none (remove them)."""
    hooks = KEPT.get(model)
    if not hooks:
        return False
    for module, hook in hooks:
        hook.active = False
        hook.reset_state(module)
    return True


def install(model: torch.nn.Module, attention: tuple[str, ...], lists: tuple[str, ...], interval: int,
            report: Report) -> int:
    """Hook the modules of `cached_modules` (inside compiled blocks: arm the hooks kept there, installing them
    the first time); the number hooked."""
    blocks = _blocks(model, lists)
    if any(COMPILED.get(block, False) for block in blocks):
        raise ValueError(f"taylorseer hooks modules inside {type(model).__name__}'s blocks, compiled whole; give "
                         "the run --cache taylorseer:N (its blocks then compile around the hooks), run it without "
                         "--compile, or use fbc:THRESHOLD, whose hooks sit outside the compiled blocks")
    compiled = any(COMPILED.get(block) is not None for block in blocks)
    kept = KEPT.get(model)
    if kept:
        for module, hook in kept:
            hook.reset_state(module)
            hook.active, hook.cache_interval, hook.report = True, interval, report
        return len(kept)
    modules = cached_modules(model, attention, lists)
    if not modules:
        raise ValueError(f"no attention or feed-forward module of {type(model).__name__} matches its family's parts "
                         f"({', '.join(attention)}); run it with --cache none")
    hooks = []
    for _, module in modules:
        state = StateManager(TaylorSeerState, init_kwargs={"taylor_factors_dtype": torch.float32,
                                                           "max_order": ORDER, "is_inactive": False})
        kind = EagerReportingHook if compiled else ReportingHook
        hook = kind(report=report, cache_interval=interval, disable_cache_before_step=WARMUP_STEPS,
                    taylor_factors_dtype=torch.float32, state_manager=state)
        HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, _TAYLORSEER_CACHE_HOOK)
        if compiled:
            hooks.append((module, hook))
    if compiled:
        KEPT.put(model, hooks)
    return len(modules)
