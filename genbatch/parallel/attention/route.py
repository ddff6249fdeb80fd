"""Handing one attention module's attention call to genbatch, with the model's own processor code.

diffusers' attention processors compute q, k, v, then make ONE call that attends: `dispatch_attention_fn`
(the processors built on diffusers' attention dispatcher: Wan, FLUX, Qwen-Image, HunyuanVideo, ...) or
`F.scaled_dot_product_attention` (the older processors: SD3's joint attention). `route_processor` gives the
module a copy of its processor whose `__call__` is the same code with that one global name bound to
genbatch's attention: the processor's projections, norms and rotary embeddings run as upstream wrote them,
and only the attention itself changes. The copy is a plain Python function, so `torch.compile` traces
straight through it (no `TorchFunctionMode`, no Python dispatch for the other ops of the module).

Why not the two registries torch and diffusers offer:
- a diffusers attention backend: the backend registry is keyed by a closed enum (`AttentionBackendName`),
  so a new backend means patching diffusers' registry; a backend is chosen per processor for every
  module alike, not per module with its streams; and SD3's processors never reach the dispatcher.
- a `torch.library.custom_op`: compile sees it as one opaque node, which would hide the all-to-alls from
  the graph (no overlap, no fusion around them); custom ops also take no Python objects (the group, the
  ledger, the layout).
The strategies (`genbatch.parallel.attention.strategy`) are genbatch's registry instead; a strategy that
must stay opaque to compile (Ring's point-to-point exchange) can still wrap its own part in a custom op.

`attend(query, key, value, attn_mask, scale)` takes and returns diffusers' layout (b, s, h, d).
`ProcessorRoutes` holds the routed classes of one model.
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

Attend = Callable[..., torch.Tensor]

_DISPATCH = "dispatch_attention_fn"


def _unsupported(flags: dict) -> None:
    used = [name for name, value in flags.items() if value]
    if used:
        raise NotImplementedError(
            f"sequence-parallel attention takes no {', '.join(used)}; run this model with --ulysses 1 --ring 1"
        )


def _dispatch_binding(attend: Attend) -> Callable[..., torch.Tensor]:
    """A stand-in for diffusers' `dispatch_attention_fn` (layout (b, s, h, d))."""

    def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                              enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
        _unsupported({"dropout": dropout_p, "causal flag": is_causal, "GQA": enable_gqa})
        return attend(query, key, value, attn_mask, scale)

    return dispatch_attention_fn


def _functional_binding(attend: Attend) -> types.ModuleType:
    """A stand-in for `torch.nn.functional` whose `scaled_dot_product_attention` (layout (b, h, s, d))
    is genbatch's; every other function is torch's own."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        _unsupported({"dropout": dropout_p, "causal flag": is_causal, "GQA": enable_gqa})
        # SDPA layout (b, h, s, d) -> diffusers layout (b, s, h, d), and back
        out = attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask, scale)
        return out.transpose(1, 2)

    functional = types.ModuleType(F.__name__)
    functional.__dict__.update(vars(F))
    functional.scaled_dot_product_attention = scaled_dot_product_attention
    return functional


def _bindings(call: types.FunctionType, attend: Attend) -> dict[str, object]:
    """The globals of `call` to rebind: whichever attention entry point its code names."""
    names = call.__code__.co_names
    bound: dict[str, object] = {}
    if _DISPATCH in names:
        bound[_DISPATCH] = _dispatch_binding(attend)
    functional = [name for name in names if call.__globals__.get(name) is F]
    if "scaled_dot_product_attention" in names:
        for name in functional:
            bound[name] = _functional_binding(attend)
    return bound


class ProcessorRoutes:
    """The routed copies of the processor classes of one model, one per (processor class, route key).

    Modules whose attention routes the same way (the same key: same streams, same strategy) share one
    routed class, so every block of a kind runs the same code with the same globals, which is what lets
    `torch.compile` reuse one graph across repeated blocks. The routed code's globals are a module of
    their own in `sys.modules` (dynamo finds a function's globals through its module name); `close()`
    removes them."""

    def __init__(self, owner: str):
        self.owner = owner
        self.classes: dict[tuple[type, object], type] = {}
        self.module_names: list[str] = []

    def route(self, name: str, module: torch.nn.Module, key: object, attend: Attend) -> object:
        """Give `module` a copy of its processor that attends with `attend`; returns the original processor."""
        processor = getattr(module, "processor", None)
        routed_class = self.classes.get((type(processor), key))
        if routed_class is None:
            routed_class = self._routed_class(name, type(processor), attend)
            self.classes[(type(processor), key)] = routed_class
        routed = copy.copy(processor)
        routed.__class__ = routed_class
        _set_processor(module, routed)
        return processor

    def _routed_class(self, name: str, processor_class: type, attend: Attend) -> type:
        call = getattr(processor_class, "__call__", None)
        bound = _bindings(call, attend) if isinstance(call, types.FunctionType) else {}
        if not bound:
            raise ValueError(
                f"{name}: its attention processor {processor_class.__name__} calls neither diffusers' "
                f"dispatch_attention_fn nor F.scaled_dot_product_attention, so sequence parallelism cannot "
                f"take over its attention; run this model with --ulysses 1 --ring 1"
            )
        module_name = f"{call.__module__}.sequence_parallel_{id(self):x}_{len(self.module_names)}"
        namespace = types.ModuleType(module_name)
        namespace.__dict__.update({**call.__globals__, **bound, "__name__": module_name})
        sys.modules[module_name] = namespace
        self.module_names.append(module_name)
        routed_call = types.FunctionType(
            call.__code__, namespace.__dict__, call.__name__, call.__defaults__, call.__closure__
        )
        routed_call.__kwdefaults__ = call.__kwdefaults__
        routed_call.__qualname__ = call.__qualname__
        routed_call.__module__ = module_name
        return type(f"SequenceParallel{processor_class.__name__}", (processor_class,), {"__call__": routed_call})

    def close(self) -> None:
        for module_name in self.module_names:
            sys.modules.pop(module_name, None)
        self.module_names.clear()
        self.classes.clear()


def _set_processor(module: torch.nn.Module, processor: object) -> None:
    # diffusers' `set_processor` also registers nn.Module processors as submodules and logs; a plain
    # attribute is what `forward` reads
    if isinstance(processor, torch.nn.Module) or "processor" in module._modules:
        module.set_processor(processor)
    else:
        module.processor = processor


def restore_processor(module: torch.nn.Module, processor: object) -> None:
    _set_processor(module, processor)
