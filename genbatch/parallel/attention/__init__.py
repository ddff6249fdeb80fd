"""Sequence-parallel attention kernels: Ulysses (all-to-all on heads), Ring (K/V point to point with
online-softmax merging) and USP (both on a 2-D group), exact against one-process attention, safe for
uneven sequence shards, and sending every byte through a counted `Comm`.

All take diffusers' layout, (batch, seq, heads, head_dim), and this rank's sequence shard; a
`SequenceLayout` tells every rank how many tokens each rank holds; key-padding masks are carried along
(`masks`).

How a model's attention reaches them: `route` gives each routed attention module a copy of its own
processor whose attention call goes to a strategy (`strategy`: `exact` is Ulysses / Ring / USP by the
group's shape; strategies that attend to stale K/V register beside it).
"""

from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.local import BACKENDS, local_attention, merge_attention, pick_backend
from genbatch.parallel.attention.ring import ring_attention
from genbatch.parallel.attention.ulysses import ulysses_attention
from genbatch.parallel.attention.usp import usp_attention

__all__ = [
    "BACKENDS",
    "SequenceLayout",
    "local_attention",
    "merge_attention",
    "pick_backend",
    "ring_attention",
    "ulysses_attention",
    "usp_attention",
]
