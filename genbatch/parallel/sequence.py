"""Sequence parallelism applied to an unmodified diffusers transformer with module hooks.

    split hooks     at the `_cp_plan` inputs: each rank keeps its (uneven, tensor_split-sized) slice
    attention       inside the plan's attention modules, the SDPA call is routed to Ulysses / Ring / USP
    gather hooks    at the `_cp_plan` outputs: the slices are all-gathered back into the full sequence

The attention swap is a `TorchFunctionMode` active only while a listed attention module runs: the
processor's call to `F.scaled_dot_product_attention` on this rank's tokens becomes the sequence-parallel
attention over all ranks' tokens. Linear layers, norms and cross-attention to replicated text are per token
and run unchanged on the local slice. Every rank of the SP group starts from the same inputs, so the
output equals a one-process forward.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from genbatch.parallel.attention import SequenceLayout, ring_attention, ulysses_attention, usp_attention
from genbatch.parallel.comm import Comm
from genbatch.parallel.plans import sequence_plan


@dataclass(slots=True)
class SequenceGroup:
    """The SP group as two axes: Ulysses inside, Ring across (SP rank = ring_rank * U + ulysses_rank)."""

    ulysses: Comm
    ring: Comm
    sp: Comm
    """All ring x ulysses ranks, in SP-rank order (for the split/gather of whole sequences)."""

    @property
    def size(self) -> int:
        return self.ulysses.size * self.ring.size

    @property
    def rank(self) -> int:
        return self.ring.rank * self.ulysses.size + self.ulysses.rank

    def attention(self, q, k, v, layout: SequenceLayout, scale: float | None = None) -> torch.Tensor:
        """(b, s_rank, h, d) shards -> this rank's shard of the full-sequence attention."""
        if self.ring.size == 1:
            return ulysses_attention(q, k, v, self.ulysses, layout, scale=scale)
        if self.ulysses.size == 1:
            return ring_attention(q, k, v, self.ring, layout, scale=scale)
        return usp_attention(q, k, v, self.ulysses, self.ring, layout, scale=scale)


@dataclass(slots=True)
class _ForwardState:
    """Per forward: the full length of each split stream (set by the split hooks, read by attention)."""

    stream_totals: dict[str, int] = field(default_factory=dict)


class _AttentionSwap(TorchFunctionMode):
    """Routes `F.scaled_dot_product_attention` to the sequence-parallel attention while active."""

    def __init__(self, sp: "SequenceParallel", streams: tuple[str, ...]):
        super().__init__()
        self.sp = sp
        self.streams = streams
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            return self.sp.attend(self.streams, *args, **kwargs)
        return func(*args, **kwargs)


class SequenceParallel:
    """Hooks that make one transformer sequence-parallel over `group`; `remove()` restores it."""

    def __init__(self, model: torch.nn.Module, group: SequenceGroup):
        self.plan, cp_plan = sequence_plan(model)
        self.group = group
        self.state = _ForwardState()
        self.handles = []
        modules = dict(model.named_modules())
        for name, spec in cp_plan.items():
            module = modules[name]
            if isinstance(spec, dict):
                self._hook_inputs(name, module, spec)
            else:
                self._hook_gather(module, spec)
        attention = self.plan.attention_modules(model)
        if not attention:
            raise ValueError(f"no attention module of {type(model).__name__} matches {self.plan.attention}")
        for name, module, streams in attention:
            self._hook_attention(name, module, streams)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    # -- splitting and gathering ---------------------------------------------------------------------

    def _split(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        total = tensor.shape[dim]
        self.state.stream_totals[stream] = total
        layout = SequenceLayout.split(total, self.group.size)
        # (..., S, ...) -> (..., s_rank, ...) along `dim`
        return layout.shard(tensor, self.group.rank, dim).contiguous()

    def _gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        total = self.state.stream_totals[self.plan.output_stream]
        lengths = SequenceLayout.split(total, self.group.size).lengths
        local = tensor.movedim(dim, 0).contiguous()  # (..., s_rank, ...) -> (s_rank, ...)
        pieces = self.group.sp.all_gather_uneven(local, lengths, kind="sp_gather")
        return torch.cat(pieces, dim=0).movedim(0, dim)  # p x (s_r, ...) -> (S, ...) -> (..., S, ...)

    def _hook_inputs(self, module_name: str, module: torch.nn.Module, specs: dict) -> None:
        params = list(inspect.signature(module.forward).parameters)
        output_specs = {key: spec for key, spec in specs.items() if spec.split_output}
        input_specs = {key: spec for key, spec in specs.items() if not spec.split_output}

        def split_value(stream, value, spec):
            if not isinstance(value, torch.Tensor) or (spec.expected_dims and value.ndim != spec.expected_dims):
                return value
            return self._split(value, spec.split_dim, stream)

        if input_specs:

            def pre_hook(mod, args, kwargs):
                args = list(args)
                for key, spec in input_specs.items():
                    if key in kwargs:
                        kwargs[key] = split_value(key, kwargs[key], spec)
                    elif key in params and params.index(key) < len(args):
                        index = params.index(key)
                        args[index] = split_value(key, args[index], spec)
                return tuple(args), kwargs

            self.handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))

        if output_specs:

            def post_hook(mod, args, output):
                items = list(output) if isinstance(output, (tuple, list)) else [output]
                for index, spec in output_specs.items():
                    items[index] = split_value(f"{module_name}:{index}", items[index], spec)
                return type(output)(items) if isinstance(output, (tuple, list)) else items[0]

            self.handles.append(module.register_forward_hook(post_hook))

    def _hook_gather(self, module: torch.nn.Module, spec) -> None:
        def post_hook(mod, args, output):
            if spec.expected_dims and output.ndim != spec.expected_dims:
                return output
            return self._gather(output, spec.gather_dim)

        self.handles.append(module.register_forward_hook(post_hook))

    # -- attention -----------------------------------------------------------------------------------

    def _layout(self, streams: tuple[str, ...]) -> SequenceLayout:
        """Per-rank token counts of an attention's sequence: the sum of its streams' slice sizes."""
        size = self.group.size
        lengths = [0] * size
        for stream in streams:
            total = self.state.stream_totals.get(stream)
            if total is None:
                raise RuntimeError(f"attention ran before the '{stream}' input was split; check the plan")
            for rank, length in enumerate(SequenceLayout.split(total, size).lengths):
                lengths[rank] += length
        return SequenceLayout(tuple(lengths))

    def attend(self, streams, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
        if attn_mask is not None or is_causal or dropout_p or enable_gqa:
            raise NotImplementedError(
                "sequence-parallel attention takes plain attention (no mask, causal flag, dropout or GQA); "
                "run this model with --ulysses 1 --ring 1"
            )
        # SDPA layout (b, h, s, d) -> diffusers layout (b, s, h, d), and back
        out = self.group.attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), self._layout(streams), scale
        )
        return out.transpose(1, 2)

    def _hook_attention(self, name: str, module: torch.nn.Module, streams: tuple[str, ...]) -> None:
        swap = _AttentionSwap(self, streams)

        def enter(mod, args, kwargs):
            swap.calls = 0
            swap.__enter__()

        def leave(mod, args, kwargs, output):
            swap.__exit__(None, None, None)
            if swap.calls == 0:
                raise RuntimeError(
                    f"{name} ran without calling torch's scaled_dot_product_attention, so sequence parallelism "
                    "could not take over its attention; use diffusers' native attention backend "
                    "(unset DIFFUSERS_ATTN_BACKEND) with --ulysses/--ring"
                )
            return output

        self.handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
        self.handles.append(module.register_forward_hook(leave, with_kwargs=True, always_call=True))
