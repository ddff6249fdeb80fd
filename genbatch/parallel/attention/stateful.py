"""Attention calls that keep Python state per job, as one node `torch.compile` does not look into.

The stale-K/V strategies (`pipefusion`, `distrifusion`) keep a job's K/V buffers, a count of the calls made in
the running forward and, for DistriFusion, gathers in flight. Traced, that state would be guards: the call
counter differs in every block, so every block would recompile (or each call would break the graph, which is
what `torch.compiler.disable` gives). `stateful_attention` is instead a custom op
(`torch.ops.genbatch.stateful_attention`): compile sees one opaque node with the shape of its query, so the
rest of the block's forward (projections, norms, rotary embeddings, the feed-forward) traces into one graph
with no break, and the node runs the strategy's eager code (`attend_now`) with its state when the graph
reaches it. The node's inputs are the call's q, k, v and mask; everything else a strategy needs is a constant
of the call site (the strategy, by a handle; the site; the streams' names; the layout's lengths, symbolic
under dynamic shapes), the same in every block. What differs per forward (a patch's token counts) the strategy
reads from its state at run time.

    handle = hold(strategy)      a handle the op finds the strategy by (weakly held: a closed run drops it)
    stateful_attention(q, k, v, key_mask, handle, site, lengths, scale, streams)

The output is a new contiguous tensor of q's shape (b, s_rank, h, d), as the op's fake says. `pack_kv` and
`unpack_kv` are the strategies' one message of K and V for a gather along the tokens.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from genbatch.parallel.attention.layout import SequenceLayout

_STRATEGIES: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
_HANDLES = itertools.count()
_SEPARATOR = ","
"""Between the stream names in the op's one string argument (a custom op takes no list of strings)."""


class StatefulAttention:
    """An attention strategy that keeps a job's state (`state`, set and cleared by the job's hook; None outside
    a job, where every call is exact), reached from compiled graphs through its `handle`."""

    def __init__(self, group):
        self.group = group
        self.state = None
        """The running job's state (None: no job, every call exact)."""
        self.handle = hold(self)

    def attend_now(self, q, k, v, *, site, layout, key_mask, scale, streams=()) -> torch.Tensor:
        raise NotImplementedError


def hold(strategy: StatefulAttention) -> int:
    """A handle by which `stateful_attention` finds `strategy` (an object with `attend_now`)."""
    handle = next(_HANDLES)
    _STRATEGIES[handle] = strategy
    return handle


@torch.library.custom_op("genbatch::stateful_attention", mutates_args=())
def stateful_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                       handle: int, site: str, lengths: list[int], scale: float | None, streams: str) -> torch.Tensor:
    """This rank's q, k, v (b, s_rank, h, d) -> the strategy's attention output (b, s_rank, h, d)."""
    try:
        strategy = _STRATEGIES[handle]
    except KeyError:
        raise RuntimeError(f"{site}: its stale-K/V attention strategy (handle {handle}) was closed with its run; "
                           "a model is used after its run ended") from None
    out = strategy.attend_now(q, k, v, site=site, layout=SequenceLayout(tuple(lengths)), key_mask=key_mask,
                              scale=scale, streams=tuple(streams.split(_SEPARATOR)) if streams else ())
    return out.contiguous()


@stateful_attention.register_fake
def _(q, k, v, key_mask, handle, site, lengths, scale, streams):
    return q.new_empty(q.shape)


def attend_through_op(handle: int, q, k, v, *, site, layout, key_mask, scale, streams=()) -> torch.Tensor:
    """A strategy's `attend`, as the op: the same arguments (`streams`: the names of the streams the keys come from)."""
    return stateful_attention(q, k, v, key_mask, handle, site, list(layout.lengths), scale, _SEPARATOR.join(streams))


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V as one tensor a gather along the tokens sends: 2 x (b, s, h, d) -> (2, b, s, h, d) -> (s, 2, b, h, d)."""
    return torch.stack((k, v)).movedim(2, 0).contiguous()


def unpack_kv(pieces: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Gathered `pack_kv` pieces, in rank order, back to K and V: p x (s_r, 2, b, h, d) -> (S, 2, b, h, d) ->
    2 x (b, S, h, d)."""
    packed = torch.cat(pieces, dim=0).movedim(0, 2)
    return packed[0], packed[1]
