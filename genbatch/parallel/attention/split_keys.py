"""Attention from queries every rank holds whole to keys split over the sequence group.

A stream the sequence splits leaves unsplit (LTX-2's audio, whole on every rank) attending to a split one (its
video): each rank attends the whole queries to its own keys, getting a partial output and its fp32
log-sum-exp, the partials are all-gathered, and every rank merges them in SP-rank order by online softmax
(`merge_attention`). Every rank merges the same parts in the same order, so the output is identical on every
rank, as the unsplit stream must stay; it equals one-process attention to fp32 rounding (the merge Ring
attention makes). A rank holding no keys sends out 0 and lse -inf, which adds nothing.

Bytes per rank: one all-gather of (s_q, d) outputs plus (h, s_q) log-sum-exps, `(p - 1)/p * p * s_q * (d + h)`
values, in place of gathering the keys and values of the split stream (`2 (p-1)/p * N * d`).
"""

from __future__ import annotations

import torch

from genbatch.parallel.attention.local import local_attention, merge_attention
from genbatch.parallel.comm import Comm


def split_keys_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, *, scale: float | None = None,
                         backend: str = "auto") -> torch.Tensor:
    """q (b, s_q, h, d), the same on every rank; k, v (b, s_k, h, d), this rank's keys -> the attention of q over
    every rank's keys (b, s_q, h, d), the same on every rank."""
    out, lse = local_attention(q, k, v, scale=scale, backend=backend)  # (b, s_q, h, d), lse (b, h, s_q) fp32
    if comm.size == 1:
        return out
    b, s_q, h, d = q.shape
    # (b, s_q, h, d) fp32 and (b, h, s_q) -> one (b * s_q * h * (d + 1),) message: the output, then the lse
    local = torch.cat([out.float().flatten(), lse.flatten()])
    gathered = local.new_empty((comm.size, local.numel()))
    comm.all_gather_into(gathered, local.unsqueeze(0), kind="sp_split_keys")
    outputs = gathered[:, :out.numel()].view(comm.size, b, s_q, h, d)
    lses = gathered[:, out.numel():].view(comm.size, b, h, s_q)
    merged, merged_lse = outputs[0].clone(), lses[0]
    for rank in range(1, comm.size):
        merged, merged_lse = merge_attention(merged, merged_lse, outputs[rank], lses[rank])
    return merged.to(q.dtype)
