"""First-Block Cache with one decision per agreement group (diffusers' hooks, the head's decision replaced).

diffusers' `FBCHeadBlockHook` runs block 0, compares its residual with the last full step's and decides with
`.item()` on this rank's own mean: under sequence parallel each rank judges its own shard, and ranks that
decide differently hang in the next all-to-all. Here the head block asks `relative_l1` over the job's
decision group instead, so every rank skips or computes the same steps. The other hooks are diffusers' own;
they find a block's metadata through its class's MRO, so FSDP2's per-block subclasses are found too.

    block 0          always runs; r = its output - its input
    decision         relative L1 of r against the last full step's, reduced over the group; skip when
                     at most the threshold (the first call of a context always computes)
    blocks 1..n-1    skipped: block 0's output + the cached residual of the last full step
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks._helpers import TransformerBlockRegistry
from diffusers.hooks.first_block_cache import (
    _FBC_BLOCK_HOOK,
    _FBC_LEADER_BLOCK_HOOK,
    FBCBlockHook,
    FBCHeadBlockHook,
    FBCSharedBlockState,
)
from diffusers.hooks.hooks import HookRegistry, ModelHook, StateManager

from genbatch.parallel.cache.agreement import relative_l1
from genbatch.parallel.comm import Comm

HOOK_NAMES = (_FBC_LEADER_BLOCK_HOOK, _FBC_BLOCK_HOOK)
"""The registry names of the hooks `install` adds (what `remove` takes away)."""

Report = Callable[[bool, "float | None"], None]
"""Called with (computed, indicator) once per forward of the head block (indicator None: first call)."""


def block_metadata(module: torch.nn.Module):
    """diffusers' block metadata of `module`'s class or the first registered class it derives from."""
    TransformerBlockRegistry._register()
    for cls in type(module).__mro__:
        if cls in TransformerBlockRegistry._registry:
            return TransformerBlockRegistry._registry[cls]
    raise ValueError(f"{type(module).__name__} is not a transformer block diffusers' First-Block Cache knows; "
                     "run this model with --cache none or --cache taylorseer:N")


class AgreedHeadHook(FBCHeadBlockHook):
    """The head block's hook: the skip decision is agreed over `comm`."""

    def __init__(self, state_manager: StateManager, threshold: float, comm: Comm, report: Report):
        super().__init__(state_manager, threshold)
        self.comm, self.report = comm, report

    def initialize_hook(self, module):
        self._metadata = block_metadata(module)
        return module

    @torch.compiler.disable
    def _should_compute_remaining_blocks(self, hidden_states_residual: torch.Tensor) -> bool:
        previous = self.state_manager.get_state().head_block_residual
        if previous is None:
            self.report(True, None)
            return True
        indicator = relative_l1(hidden_states_residual, previous, self.comm)
        computed = indicator > self.threshold
        self.report(computed, indicator)
        return computed


class BlockHook(FBCBlockHook):
    """diffusers' hook of the skipped blocks, finding its metadata through the MRO."""

    def initialize_hook(self, module):
        self._metadata = block_metadata(module)
        return module


class TailHook(BlockHook):
    """The last block's hook: diffusers' (cache the tail residuals when computing), except that a last block
    which drops the text stream (SD3's `context_pre_only` block returns None for it) caches a zero text
    residual, so a skipped step passes block 0's text output on (which the model no longer reads)."""

    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        state = self.state_manager.get_state()
        if not state.should_compute:
            return super().new_forward(module, *args, **kwargs)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if not isinstance(output, tuple):
            state.tail_block_residuals = (output - state.head_block_output, None)
            return output
        head_hidden, head_text = state.head_block_output[0], state.head_block_output[1]
        text = output[self._metadata.return_encoder_hidden_states_index]
        state.tail_block_residuals = (
            output[self._metadata.return_hidden_states_index] - head_hidden,
            torch.zeros_like(head_text) if text is None else text - head_text,
        )
        return output


def repeated_blocks(model: torch.nn.Module, lists: tuple[str, ...]) -> list[torch.nn.Module]:
    """Every block of the model's repeated lists, in forward order (FLUX: the double blocks, then the single)."""
    return [block for name in lists for block in model.get_submodule(name)]


def hook_span(model: torch.nn.Module, lists: tuple[str, ...], mode: str, state: StateManager, head: ModelHook,
              head_name: str) -> int:
    """Register `head` on the first block of `lists` (the family's repeated lists) and the pass-through
    hooks on the others, the last one keeping the span's residual; the number of blocks hooked."""
    blocks = repeated_blocks(model, lists)
    if len(blocks) < 2:
        raise ValueError(f"{type(model).__name__} has {len(blocks)} repeated block(s); {mode} needs 2 or more: "
                         "run it with --cache none")
    first, *middle, tail = blocks
    HookRegistry.check_if_exists_or_initialize(first).register_hook(head, head_name)
    for block in middle:
        HookRegistry.check_if_exists_or_initialize(block).register_hook(BlockHook(state), _FBC_BLOCK_HOOK)
    HookRegistry.check_if_exists_or_initialize(tail).register_hook(TailHook(state, is_tail=True), _FBC_BLOCK_HOOK)
    return len(blocks)


def install(model: torch.nn.Module, lists: tuple[str, ...], threshold: float, comm: Comm, report: Report) -> int:
    """Add the First-Block-Cache hooks to the blocks of `lists`; the number of blocks hooked."""
    state = StateManager(FBCSharedBlockState, (), {})
    return hook_span(model, lists, "First-Block Cache", state, AgreedHeadHook(state, threshold, comm, report),
                     _FBC_LEADER_BLOCK_HOOK)
