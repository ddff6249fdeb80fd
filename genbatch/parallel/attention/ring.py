"""Ring attention: K/V blocks travel point to point around the ring while each rank attends to the block it
holds; partial results merge by online softmax on the fp32 log-sum-exp.

Round i on rank r: it holds the K/V block of rank (r - i) mod p. It first STARTS sending that block to rank
r+1 and receiving block (r - i - 1) mod p from rank r-1 (one `Comm.exchange`, K and V packed in one
buffer), THEN computes attention on the block it holds, and only then waits for the transfer: the next
block's transfer overlaps the current block's attention. After p rounds every query has seen every key.
Only two K/V blocks are alive at a time; the whole K/V is never gathered.

Each rank sends p-1 blocks: `2 (p-1)/p * N * d` elements for even shards, seed 000's Ring row. Block sizes
may differ (uneven layout): every rank knows every block's length from the layout, so receive buffers are
sized without asking, and empty blocks are neither sent nor attended to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from genbatch.parallel.attention.layout import SequenceLayout, check_qkv
from genbatch.parallel.attention.local import local_attention, merge_attention
from genbatch.parallel.comm import Comm


def ring_pass(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: Comm,
    lengths: Sequence[int],
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    backend: str = "auto",
    seed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q, k, v (b, s_rank, h, d) with `lengths[r]` tokens on ring rank r -> out (b, s_rank, h, d); `backend`:
    the local kernel of each block (`local_attention`'s).

    `key_mask` (b, sum(lengths)) bool, in ring-rank order, drops padded keys: every rank holds all of it
    (it is small), so only K/V travel and each block's slice of the mask is cut locally. `seed`: (out, lse) of
    q over keys no ring rank holds (a prefix every rank keeps whole: `attention.prefix`), merged first."""
    p, r = comm.size, comm.rank
    if p == 1 and seed is None:
        return local_attention(q, k, v, scale=scale, key_mask=key_mask, backend=backend)[0]
    offsets = SequenceLayout(tuple(lengths)).offsets
    b, s_q, h, d = q.shape
    after, before = (r + 1) % p, (r - 1) % p
    kv = torch.stack((k, v))  # 2 x (b, s, h, d) -> (2, b, s, h, d): one message per round
    out, lse = (None, None) if seed is None else (seed[0].float(), seed[1])
    for step in range(p):
        holder = (r - step) % p  # whose K/V block this rank holds in this round
        works, incoming = [], None
        if step < p - 1:  # start the next block's transfer before attending to this one
            incoming_len = lengths[(holder - 1) % p]
            incoming = kv.new_empty((2, b, incoming_len, h, d))
            sends = [(kv, after)] if lengths[holder] else []
            recvs = [(incoming, before)] if incoming_len else []
            works = comm.exchange(sends, recvs)
        if s_q and lengths[holder]:
            block_mask = None if key_mask is None else key_mask.narrow(1, offsets[holder], lengths[holder])
            block_out, block_lse = local_attention(q, kv[0], kv[1], scale=scale, key_mask=block_mask, backend=backend)
            if out is None:  # the first block (this rank's own, never empty here) when there is no seed
                out, lse = block_out.float(), block_lse
            else:
                out, lse = merge_attention(out, lse, block_out, block_lse)
        for work in works:
            work.wait()
        if incoming is not None:
            kv = incoming
    if out is None:  # this rank holds no queries
        return q.new_empty((b, 0, h, d))
    return out.to(q.dtype)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: Comm,
    layout: SequenceLayout,
    *,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """This rank's shard q, k, v (b, s_rank, h, d) -> its shard of the full-sequence attention (b, s_rank, h, d).

    `backend`: the local kernel. `comm` is the ring group; `layout` gives every ring rank's s_rank (uneven allowed); `key_mask` (b, S)
    bool in ring-rank order drops padded keys."""
    check_qkv(q, k, v, "ring_attention")
    layout.check(comm.size, comm.rank, q.shape[1], "ring_attention")
    return ring_pass(q, k, v, comm, layout.lengths, scale, key_mask, backend)
