"""Attention from split tokens to a prefix every rank keeps whole, plus every rank's split tokens.

A block-causal transformer with a cached prefix (Qwen-Image 2.1: the prompt's and condition images' tokens
first, the output's last) needs, for the output's queries, the keys of the whole prefix and of every output
token. Sequence parallelism splits the output's tokens only; each rank computes the prefix whole (at the first
step; later steps read its cached keys and values), so the prefix's keys are already on every rank and only the
output's travel:

    Ulysses  the output's q, k, v are scattered by heads as usual; each rank attends its h/U heads of the whole
             output over [its h/U heads of the prefix, the whole output]: one softmax, as one process computes
    Ring     each rank attends its queries to the prefix first (out, lse), then the ring merges every rank's
             output block into that seed by online softmax
    USP      Ulysses inside, then the ring over the rows, seeded by the prefix's heads of this Ulysses rank

The prefix's key-padding mask (padded prompt tokens) applies to the prefix's keys; the output's keys are never
padded. Bytes are those of Ulysses / Ring over the output's tokens alone: the prefix never travels.
"""

from __future__ import annotations

import torch

from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout, check_qkv
from genbatch.parallel.attention.local import local_attention
from genbatch.parallel.attention.ring import ring_pass
from genbatch.parallel.attention.ulysses import ulysses_wrap


def prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    group: SequenceGroup,
    layout: SequenceLayout,
    *,
    prefix_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """This rank's split tokens q, k, v (b, s_rank, h, d) and the whole prefix's keys and values (b, P, h, d), the
    same on every rank -> this rank's shard of the attention of every split token over [prefix, all split
    tokens] (b, s_rank, h, d). `layout`: every SP rank's s_rank; `prefix_mask` (b, P) bool drops padded keys."""
    check_qkv(q, k, v, "prefix_attention")
    u = group.ulysses.size
    layout.check(group.size, group.rank, q.shape[1], "prefix_attention")
    heads = q.shape[2] // u  # the heads this Ulysses rank attends with (all of them when U = 1)
    # (b, P, h, d) -> (b, P, h/U, d): this Ulysses rank's heads, the block `scatter_heads` hands it
    prefix_k = prefix_k.narrow(2, group.ulysses.rank * heads, heads)
    prefix_v = prefix_v.narrow(2, group.ulysses.rank * heads, heads)
    backend = group.kernel

    def attend(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor) -> torch.Tensor:
        # qh, kh, vh (b, S_row, h/U, d): this ring row's split tokens, gathered by Ulysses
        if group.ring.size == 1:
            keys = torch.cat([prefix_k, kh], dim=1)  # (b, P + S, h/U, d)
            values = torch.cat([prefix_v, vh], dim=1)
            mask = None
            if prefix_mask is not None:  # (b, P) + the split tokens' (b, S), never padded
                mask = torch.cat([prefix_mask, prefix_mask.new_ones((qh.shape[0], kh.shape[1]))], dim=1)
            return local_attention(qh, keys, values, scale=scale, key_mask=mask, backend=backend)[0]
        seed = local_attention(qh, prefix_k, prefix_v, scale=scale, key_mask=prefix_mask, backend=backend)
        return ring_pass(qh, kh, vh, group.ring, layout.rows(u).lengths, scale, None, backend, seed=seed)

    return ulysses_wrap(q, k, v, group.ulysses, layout.row(group.ring.rank, u).lengths, attend)


__all__ = ["prefix_attention"]
