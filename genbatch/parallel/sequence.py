"""Sequence parallelism applied to an unmodified diffusers transformer with module hooks.

    split hooks     at the split points of the model's sequence splits: each rank keeps its (uneven,
                    tensor_split-sized) slice of every split stream
    attention       the routing's attention modules get a copy of their own processor whose one attention call
                    is the routing's strategy over all ranks' tokens (`genbatch.parallel.attention.route`)
    gather hooks    at the gather points: the slices are all-gathered back into the full sequence

Linear layers, norms and cross-attention to replicated text are per token and run unchanged on the local
slice. Every rank of the SP group starts from the same inputs, so the output equals a one-process forward.
Key-padding masks are carried into the split attention (`genbatch.parallel.attention.masks`).
"""

from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass, field

import torch

from genbatch.parallel.attention import masks
from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.route import ProcessorRoutes, restore_processor
from genbatch.parallel.attention.split_keys import split_keys_attention
from genbatch.parallel.attention.strategy import AttentionStrategy, make_strategy
from genbatch.parallel.marks import ModuleMark
from genbatch.parallel.routing import sequence_routing

SEQUENCE_PARALLEL: ModuleMark[SequenceParallel] = ModuleMark("sequence parallel")
"""A sequence-parallel model's `SequenceParallel` (read by the job hooks that set state on its strategies:
`genbatch.parallel.patch.session`, `genbatch.parallel.pipeline.session`)."""

__all__ = ["SequenceGroup", "SequenceParallel"]


@dataclass(slots=True)
class _ForwardState:
    """Per forward: the full length of each split stream (set by the split hooks, read by attention), and
    the layouts derived from them."""

    stream_totals: dict[str, int] = field(default_factory=dict)
    layouts: dict[tuple[str, ...], SequenceLayout] = field(default_factory=dict)
    uneven: bool = False
    """True when some split stream does not divide evenly over the group. A compiled block reads only this
    flag (a guard that holds across sizes), never the totals (a guard per size: a recompile per job)."""


def hook_split_points(module_name: str, module: torch.nn.Module, specs: dict, cut, prepend: bool = False) -> list:
    """Hooks that pass each split value of `module` (its inputs by name, or its outputs by index, as `specs`
    name them: a `ContextParallelInput` table) through `cut(tensor, dim, stream)`; returns the handles.
    A value that is not a tensor of the spec's rank is left alone. `prepend`: run before hooks already there."""
    params = list(inspect.signature(module.forward).parameters)
    output_specs = {key: spec for key, spec in specs.items() if spec.split_output}
    input_specs = {key: spec for key, spec in specs.items() if not spec.split_output}
    handles = []

    def split_value(stream, value, spec):
        if not isinstance(value, torch.Tensor) or (spec.expected_dims and value.ndim != spec.expected_dims):
            return value
        return cut(value, spec.split_dim, stream)

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

        handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=prepend))

    if output_specs:

        def post_hook(mod, args, output):
            items = list(output) if isinstance(output, (tuple, list)) else [output]
            for index, spec in output_specs.items():
                items[index] = split_value(f"{module_name}:{index}", items[index], spec)
            return type(output)(items) if isinstance(output, (tuple, list)) else items[0]

        handles.append(module.register_forward_hook(post_hook, prepend=prepend))
    return handles


class _Route:
    """The attention of every module that attends over the same split streams with the same strategy
    (e.g. every block's self-attention): one route, shared, so repeated blocks run identical code.
    `name` is the routing's pattern for those modules."""

    def __init__(self, sp: SequenceParallel, name: str, streams: tuple[str, ...], strategy: AttentionStrategy):
        self.sp, self.name, self.streams, self.strategy = sp, name, streams, strategy
        self.used = False
        """Set by every call (a store, never read while compiling: a counter would be a guard that changes)."""

    def attend(self, query, key, value, attn_mask, scale):
        """q, k, v (b, s_rank, h, d) of this rank's tokens -> its shard of the full-sequence attention."""
        self.used = True
        layout = self.sp.layout(self.streams, query.shape[1])
        key_mask = None
        if attn_mask is not None:
            mask = masks.key_padding(attn_mask, query.shape[0], self.name)
            totals = [self.sp.state.stream_totals[stream] for stream in self.streams]
            key_mask = masks.rank_ordered(mask, totals, layout, self.sp.group.sp, self.name)
        return self.strategy.attend(query, key, value, site=self.name, layout=layout, key_mask=key_mask,
                                    scale=scale, streams=self.streams)


class _SplitKeysRoute(_Route):
    """The attention of modules whose queries every rank holds whole and whose keys are this rank's share of
    split streams (`genbatch.models.base.SPLIT_KEYS`): the partial results merge over the group
    (`split_keys_attention`), whatever the run's strategy."""

    def __init__(self, sp: SequenceParallel, name: str, streams: tuple[str, ...]):
        self.sp, self.name, self.streams, self.strategy = sp, name, streams, None
        self.used = False

    def attend(self, query, key, value, attn_mask, scale):
        """q (b, s_q, h, d) whole, k, v (b, s_rank, h, d) this rank's -> (b, s_q, h, d), the same on every rank."""
        self.used = True
        if attn_mask is not None:
            raise NotImplementedError(f"{self.name}: attention to split keys takes no mask; run this model with "
                                      "--ulysses 1 --ring 1")
        return split_keys_attention(query, key, value, self.sp.group.sp, scale=scale, backend=self.sp.group.kernel)


class SequenceParallel:
    """Hooks that make one transformer sequence-parallel over `group`; `remove()` restores it.

    `strategy` names one attention strategy for every routed module; by default each module uses the one
    its model's routing names (`exact` unless it says otherwise)."""

    def __init__(self, model: torch.nn.Module, group: SequenceGroup, strategy: str | None = None):
        self.routing, points = sequence_routing(model)
        self.group = group
        self.state = _ForwardState()
        self.handles = []
        self.routed: list[tuple[torch.nn.Module, object]] = []
        self.routes = ProcessorRoutes(type(model).__name__)
        self.strategies: dict[str, AttentionStrategy] = {}
        """The strategies the routed modules attend with, by name (a job's stale-K/V state is set on them)."""
        self.model = model
        SEQUENCE_PARALLEL.put(model, self)
        if self.routing.kept_prefix is not None:
            self._keep_prefix(model, group, strategy)
            return
        named = list(model.named_modules())
        for key, spec in points.items():
            targets = [(name, module) for name, module in named if fnmatch.fnmatchcase(name, key)]
            if not targets:
                raise ValueError(f"the sequence splits of {type(model).__name__} names {key!r}, which it does not have")
            for name, module in targets:
                if isinstance(spec, dict):
                    self._hook_inputs(name, module, spec)
                else:
                    self._hook_gather(module, spec)
        attention = self.routing.attention_modules(model)
        if not attention:
            raise ValueError(f"no attention module of {type(model).__name__} matches {self.routing.attention}")
        strategies: dict[str, AttentionStrategy] = self.strategies
        routes: dict[tuple, _Route] = {}
        for name, module, streams, declared in attention:
            if self.routing.has_split_keys(name):
                key = (streams, "split_keys")
                if key not in routes:
                    routes[key] = _SplitKeysRoute(self, self.routing.pattern_of(name), streams)
                self._route(name, module, key, routes[key])
                continue
            chosen = strategy or declared
            if chosen not in strategies:
                strategies[chosen] = make_strategy(chosen, group)
            key = (streams, chosen)
            if key not in routes:
                routes[key] = _Route(self, self.routing.pattern_of(name), streams, strategies[chosen])
            self._route(name, module, key, routes[key])

    def _keep_prefix(self, model: torch.nn.Module, group: SequenceGroup, strategy: str | None) -> None:
        """A block-causal model's kept prefix (`genbatch.parallel.kept_prefix`): its hooks, and one route for every
        attention module."""
        from genbatch.parallel.kept_prefix import KeptPrefixRoute, KeptPrefixSplit

        name = type(model).__name__
        if strategy is not None:
            raise ValueError(f"{name} attends block-causally over a cached prefix, which stale-K/V attention "
                             f"({strategy}: PipeFusion, DistriFusion) cannot keep; run it with --ulysses or --ring, "
                             "--tp, --cfg or --dp")
        split = KeptPrefixSplit(model, self.routing.kept_prefix, group)
        self.handles += split.handles
        routes: dict[str, KeptPrefixRoute] = {}  # one per pattern, shared: the routed class binds its attend
        for module_name, module, _, _ in self.routing.attention_modules(model):
            pattern = self.routing.pattern_of(module_name)
            if pattern not in routes:
                routes[pattern] = KeptPrefixRoute(split, pattern)
            self._route(module_name, module, ("kept_prefix", pattern), routes[pattern])

    def remove(self) -> None:
        if SEQUENCE_PARALLEL.get(self.model) is self:
            SEQUENCE_PARALLEL.pop(self.model)
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for module, processor in self.routed:
            restore_processor(module, processor)
        self.routed.clear()
        self.routes.close()

    # -- splitting and gathering ---------------------------------------------------------------------

    def _split(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        total = tensor.shape[dim]
        if self.state.stream_totals.get(stream) != total:
            self.state.stream_totals[stream] = total
            self.state.layouts.clear()
            self.state.uneven = any(length % self.group.size for length in self.state.stream_totals.values())
        layout = SequenceLayout.split(total, self.group.size)
        # (..., S, ...) -> (..., s_rank, ...) along `dim`
        return layout.shard(tensor, self.group.rank, dim).contiguous()

    def _gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        total = self.state.stream_totals[self.routing.output_stream]
        lengths = SequenceLayout.split(total, self.group.size).lengths
        local = tensor.movedim(dim, 0).contiguous()  # (..., s_rank, ...) -> (s_rank, ...)
        pieces = self.group.sp.all_gather_uneven(local, lengths, kind="sp_gather")
        return torch.cat(pieces, dim=0).movedim(0, dim)  # p x (s_r, ...) -> (S, ...) -> (..., S, ...)

    def _hook_inputs(self, module_name: str, module: torch.nn.Module, specs: dict) -> None:
        self.handles += hook_split_points(module_name, module, specs, self._split)

    def _hook_gather(self, module: torch.nn.Module, spec) -> None:
        def post_hook(mod, args, output):
            if spec.expected_dims and output.ndim != spec.expected_dims:
                return output
            return self._gather(output, spec.gather_dim)

        self.handles.append(module.register_forward_hook(post_hook))

    # -- attention -----------------------------------------------------------------------------------

    def layout(self, streams: tuple[str, ...], local_length=None) -> SequenceLayout:
        """Per-rank token counts of an attention's sequence: the sum of its streams' slice sizes.

        `local_length` is this rank's count (the query's sequence size). Inside a compiled block, with every
        stream even over the group, every rank holds that many: the layout is built from it, a symbolic size
        under dynamic shapes, so one graph serves every size (the totals would be constants guarded per size)."""
        compiling = torch.compiler.is_compiling()  # no cache inside a compiled block: its state would be a guard
        if compiling and local_length is not None and not self.state.uneven:
            return SequenceLayout((local_length,) * self.group.size)
        cached = None if compiling else self.state.layouts.get(streams)
        if cached is not None:
            return cached
        size = self.group.size
        lengths = [0] * size
        for stream in streams:
            total = self.state.stream_totals.get(stream)
            if total is None:
                raise RuntimeError(f"attention ran before the '{stream}' input was split; check the family's split points")
            for rank, length in enumerate(SequenceLayout.split(total, size).lengths):
                lengths[rank] += length
        layout = SequenceLayout(tuple(lengths))
        if not compiling:
            self.state.layouts[streams] = layout
        return layout

    def _route(self, name: str, module: torch.nn.Module, key: tuple, route: _Route) -> None:
        self.routed.append((module, self.routes.route(name, module, key, route.attend)))

        def count_calls(mod, args, kwargs):
            route.used = False

        def check_called(mod, args, kwargs, output):
            # eager only: the first forward proves the processor's attention call went through the route
            if torch.compiler.is_compiling():
                return output
            if not route.used:
                raise RuntimeError(
                    f"{name} ran without making its attention call, so sequence parallelism could not take "
                    "over its attention; run this model with --ulysses 1 --ring 1"
                )
            counting.remove()
            handle.remove()
            return output

        counting = module.register_forward_pre_hook(count_calls, with_kwargs=True)
        handle = module.register_forward_hook(check_called, with_kwargs=True)
        self.handles += [counting, handle]
