"""USP (unified sequence parallel): Ulysses inside, Ring across, on a 2-D (ring, ulysses) group.

The SP rank of a process is `ring_rank * U + ulysses_rank`: Ulysses ranks are contiguous (inside a node,
where all-to-all is fast) and the ring goes across (point to point, fine over slower links). Ulysses first
gathers its row's sequence for h/U heads; the ring then runs over the rows, whose ranks all hold the same
head group; Ulysses finally returns the output to the sequence shards.

Bytes per rank (even shards, N tokens, d = h * head_dim): Ulysses `4 (U-1)/U^2 * (N/R) * d` on its group plus
Ring `2 (R-1)/R * N * d/U` on its group.
"""

from __future__ import annotations

import torch

from genbatch.parallel.attention.layout import SequenceLayout, check_qkv
from genbatch.parallel.attention.ring import ring_pass
from genbatch.parallel.attention.ulysses import ulysses_wrap
from genbatch.parallel.comm import Comm


def usp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses: Comm,
    ring: Comm,
    layout: SequenceLayout,
    *,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """This rank's shard q, k, v (b, s_rank, h, d) -> its shard of the full-sequence attention (b, s_rank, h, d).

    `backend`: the local kernel. `layout` covers all U x R ranks in SP-rank order (ring_rank * U + ulysses_rank); U must divide h.
    `key_mask` (b, S) bool in SP-rank order drops padded keys: a ring row's keys are the contiguous keys of
    its Ulysses ranks, so the same mask serves the ring over the rows."""
    check_qkv(q, k, v, "usp_attention")
    u = ulysses.size
    layout.check(u * ring.size, ring.rank * u + ulysses.rank, q.shape[1], "usp_attention")
    row = layout.row(ring.rank, u).lengths  # the Ulysses group's shards
    rows = layout.rows(u).lengths  # what each ring rank holds after the Ulysses gather

    def attend(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor) -> torch.Tensor:
        # (b, S_row, h/U, d) for the whole row -> ring over the rows, same head group on every ring rank
        return ring_pass(qh, kh, vh, ring, rows, scale, key_mask, backend)

    return ulysses_wrap(q, k, v, ulysses, row, attend)
