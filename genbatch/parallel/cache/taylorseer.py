"""TaylorSeer on the family's own modules (diffusers' hooks, with genbatch's module choice).

diffusers' default patterns (`^blocks.*attn`, `^transformer_blocks.*attn`, fullmatched) match no module of
Wan (`blocks.N.attn1` / `attn2`), so TaylorSeer silently does nothing there. genbatch hooks what the family
plan names instead: every attention module of its `AttentionSite`s, and every diffusers `FeedForward`
inside the repeated blocks. `install` returns how many modules it hooked (a model with none is refused).

Those modules live inside the blocks, so under `--compile` (whose compiled regions are the blocks' forwards,
traced with `fullgraph=True`) the hooks would sit inside compiled code: TaylorSeer is refused there (gen run
at start-up, a manifest row's job when it starts), and `fbc`, whose hooks wrap the blocks' compiled forwards
from outside, is the mode to use with `--compile`.

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


def install(model: torch.nn.Module, attention: tuple[str, ...], lists: tuple[str, ...], interval: int,
            report: Report) -> int:
    """Hook the modules of `cached_modules`; the number hooked."""
    compiled = [name for name in lists for block in model.get_submodule(name)
                if hasattr(block.forward, "_torchdynamo_orig_callable")]
    if compiled:
        raise ValueError(f"taylorseer hooks modules inside {type(model).__name__}'s compiled blocks; run it "
                         "without --compile, or use fbc:THRESHOLD, whose hooks sit outside the compiled blocks")
    modules = cached_modules(model, attention, lists)
    if not modules:
        raise ValueError(f"no attention or feed-forward module of {type(model).__name__} matches its plan "
                         f"({', '.join(attention)}); run it with --cache none")
    for _, module in modules:
        state = StateManager(TaylorSeerState, init_kwargs={"taylor_factors_dtype": torch.float32,
                                                           "max_order": ORDER, "is_inactive": False})
        hook = ReportingHook(report=report, cache_interval=interval, disable_cache_before_step=WARMUP_STEPS,
                             taylor_factors_dtype=torch.float32, state_manager=state)
        HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, _TAYLORSEER_CACHE_HOOK)
    return len(modules)
