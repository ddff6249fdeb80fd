"""TeaCache with one decision per agreement group: skip every block while the rescaled input change stays small.

TeaCache is not in diffusers; this follows the reference implementation (ali-vilab/TeaCache) with diffusers'
hook machinery and FBC's block hooks (`fbc.hook_span`: the pass-through blocks and the tail's residual):

    block 0's hook    before block 0 runs: m = the timestep-modulated input (`MODULATED`), the change
                      relative_l1(m, m_prev) reduced over the decision group (exact, as FBC's), rescaled by
                      the model's polynomial and added to the accumulator; skip while the sum stays below
                      the threshold, else compute and reset the sum (teacache:0 always computes: a
                      published polynomial can be negative near 0). The first `warmup_steps` and the last
                      step always compute (and reset the sum).
    computed step     every block runs; the last block's hook keeps (its output - block 0's input)
    skipped step      block 0 returns its input + that residual, the other blocks pass it on unchanged

Each cache context (the guidance branch's name) keeps its own m_prev, sum and residual, and the state lives
in the job's hooks (removed when the job ends). Every rank of the group reads the same reduced value and
counts the same steps, so every rank decides the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks.first_block_cache import _FBC_BLOCK_HOOK, FBCSharedBlockState
from diffusers.hooks.hooks import ModelHook, StateManager

from genbatch.models.teacache import TeaCacheModel
from genbatch.parallel.cache.agreement import relative_l1
from genbatch.parallel.cache.fbc import Report, block_metadata, hook_span
from genbatch.parallel.comm import Comm

HEAD_HOOK = "genbatch_teacache_head"
"""The registry name of block 0's hook."""
HOOK_NAMES = (HEAD_HOOK, _FBC_BLOCK_HOOK)
"""The registry names of the hooks `install` adds (what `remove` takes away)."""


def _wan_modulated(block: torch.nn.Module, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """Wan: the timestep projection the block is modulated by, (b, 6, dim) (the reference's `e0`)."""
    return temb


def _flux_modulated(block: torch.nn.Module, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """FLUX: block 0's AdaLayerNormZero output, (b, s/p, dim) (this rank's tokens)."""
    return block.norm1(hidden, emb=temb)[0]


MODULATED: dict[str, Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "WanTransformerBlock": _wan_modulated,
    "FluxTransformerBlock": _flux_modulated,
}
"""The timestep-modulated input of a first block, by block class: what the published coefficients were fitted on."""


def modulated_input(block: torch.nn.Module) -> Callable:
    """`MODULATED`'s function for `block`'s class (or the first registered class it derives from: FSDP2)."""
    for cls in type(block).__mro__:
        if cls.__name__ in MODULATED:
            return MODULATED[cls.__name__]
    raise ValueError(f"TeaCache reads the modulated input of {', '.join(MODULATED)} first blocks, not "
                     f"{type(block).__name__}; run this model with --cache none or fbc:THRESHOLD")


class TeaState(FBCSharedBlockState):
    """One cache context's state: FBC's (block 0's input as `head_block_output`, the tail residuals) and
    TeaCache's own."""

    def __init__(self) -> None:
        super().__init__()
        self.previous: torch.Tensor | None = None
        self.accumulated = 0.0


class HeadHook(ModelHook):
    """Block 0's hook: decides for the step over `comm`, and on a skipped step stands in for every block."""

    _is_stateful = True

    def __init__(self, state: StateManager, model: TeaCacheModel, threshold: float, steps: int, comm: Comm,
                 report: Report):
        super().__init__()
        self.state_manager, self.model, self.threshold = state, model, threshold
        self.steps, self.comm, self.report = steps, comm, report

    def initialize_hook(self, module):
        self._metadata = block_metadata(module)
        self._modulated = modulated_input(module)
        return module

    def reset_state(self, module):
        self.state_manager.reset()
        return module

    @torch.compiler.disable
    def _should_compute(self, current: torch.Tensor, state: TeaState) -> bool:
        step = self.state_manager.context.step_index
        previous, state.previous = state.previous, current
        if previous is None or step < self.model.warmup_steps or step >= self.steps - 1:
            state.accumulated = 0.0
            self.report(True, None)
            return True
        total = state.accumulated + self.model.rescale(relative_l1(current, previous, self.comm))
        computed = self.threshold == 0 or not total < self.threshold  # teacache:0 skips nothing
        state.accumulated = 0.0 if computed else total
        self.report(computed, total)
        return computed

    def new_forward(self, module: torch.nn.Module, *args, **kwargs):
        metadata = self._metadata
        hidden = metadata._get_parameter_from_args_kwargs("hidden_states", args, kwargs)
        text = None
        if metadata.return_encoder_hidden_states_index is not None:
            text = metadata._get_parameter_from_args_kwargs("encoder_hidden_states", args, kwargs)
        temb = metadata._get_parameter_from_args_kwargs("temb", args, kwargs)
        state: TeaState = self.state_manager.get_state()
        current = self._modulated(module, hidden, temb).detach().clone()
        state.should_compute = self._should_compute(current, state)
        if state.should_compute:
            state.head_block_output = hidden if text is None else [hidden, text]  # the tail's residual base
            return self.fn_ref.original_forward(*args, **kwargs)
        residual, text_residual = state.tail_block_residuals
        if text is None:
            return hidden + residual
        output = [None, None]
        output[metadata.return_hidden_states_index] = hidden + residual
        output[metadata.return_encoder_hidden_states_index] = text + text_residual
        return tuple(output)


def install(model: torch.nn.Module, lists: tuple[str, ...], covered: TeaCacheModel, threshold: float, steps: int,
            comm: Comm, report: Report) -> int:
    """Add TeaCache's hooks to the blocks of `lists` (the family's repeated lists) for a job of `steps`
    steps; the number of blocks hooked."""
    state = StateManager(TeaState, (), {})
    return hook_span(model, lists, "TeaCache", state, HeadHook(state, covered, threshold, steps, comm, report),
                     HEAD_HOOK)
