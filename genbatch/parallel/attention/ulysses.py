"""Ulysses attention: an all-to-all scatters the heads and gathers the sequence, attention runs on whole
sequences for h/U heads, and an all-to-all brings the output back to the sequence shards.

q, k and v travel in ONE all-to-all (stacked), the output in a second: per attention layer each rank sends
`(U-1)/U` of its q, k, v and output shards, i.e. seed 000's `4 (U-1)/U^2 * N * d` elements for even shards.
Uneven shards use uneven split sizes in `all_to_all_single` (gloo and NCCL both take them), so nothing is
padded. The sequence is the leading dim of every buffer, which is what makes uneven splits possible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from genbatch.parallel.attention.layout import SequenceLayout, check_qkv
from genbatch.parallel.attention.local import local_attention
from genbatch.parallel.comm import Comm

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_heads(heads: int, degree: int) -> None:
    """Ulysses splits the heads, so its degree must divide the head count."""
    if heads % degree:
        valid = [u for u in range(1, heads + 1) if heads % u == 0]
        raise ValueError(
            f"Ulysses degree {degree} does not divide the {heads} attention heads; use a Ulysses degree in "
            f"{valid} and put the rest of the sequence-parallel degree on the ring"
        )


def scatter_heads(tensors: Sequence[torch.Tensor], comm: Comm, lengths: Sequence[int]) -> list[torch.Tensor]:
    """t tensors (b, s_rank, h, d) -> t tensors (b, S, h/U, d) in one all-to-all (S = sum(lengths))."""
    t, u = len(tensors), comm.size
    b, s, h, d = tensors[0].shape
    send = tensors[0].new_empty((u, s, t, b, h // u, d))
    for i, x in enumerate(tensors):
        # (b, s, h, d) -> (b, s, U, h/U, d) -> (U, s, b, h/U, d)
        send[:, :, i] = x.reshape(b, s, u, h // u, d).permute(2, 1, 0, 3, 4)
    recv = send.new_empty((sum(lengths), t, b, h // u, d))
    # (U, s, t, b, h/U, d) -> (U*s, t, b, h/U, d): row block j goes to rank j, which receives the blocks
    # of every rank in rank order, i.e. (S, t, b, h/U, d) in sequence order
    comm.all_to_all(recv, send.view(u * s, t, b, h // u, d), list(lengths), [s] * u)
    # (S, t, b, h/U, d) -> t views (b, S, h/U, d)
    return [recv[:, i].permute(1, 0, 2, 3) for i in range(t)]


def gather_heads(x: torch.Tensor, comm: Comm, lengths: Sequence[int]) -> torch.Tensor:
    """(b, S, h/U, d) -> (b, s_rank, h, d): the inverse of `scatter_heads` for one tensor."""
    u, s = comm.size, lengths[comm.rank]
    b, _, hu, d = x.shape
    send = x.permute(1, 0, 2, 3).contiguous()  # (b, S, h/U, d) -> (S, b, h/U, d)
    recv = send.new_empty((u * s, b, hu, d))
    comm.all_to_all(recv, send, [s] * u, list(lengths))
    # (U*s, b, h/U, d) -> (U, s, b, h/U, d) -> (b, s, U, h/U, d) -> (b, s, h, d)
    return recv.view(u, s, b, hu, d).permute(2, 1, 0, 3, 4).reshape(b, s, u * hu, d)


def ulysses_wrap(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, lengths: Sequence[int], attend: Attend
) -> torch.Tensor:
    """Scatter heads / gather sequence, run `attend` on (b, S, h/U, d), and bring the output back."""
    check_heads(q.shape[2], comm.size)
    if comm.size == 1:
        return attend(q, k, v)
    qh, kh, vh = scatter_heads((q, k, v), comm, lengths)
    return gather_heads(attend(qh, kh, vh), comm, lengths)


def ulysses_attention(
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

    `backend`: the local kernel (`local_attention`'s). `comm` is the Ulysses group (its size U must divide h); `layout` gives every rank's s_rank. `key_mask`
    (b, S) bool, in rank order (every rank's keys one after the other), drops padded keys."""
    check_qkv(q, k, v, "ulysses_attention")
    layout.check(comm.size, comm.rank, q.shape[1], "ulysses_attention")

    def attend(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor) -> torch.Tensor:
        return local_attention(qh, kh, vh, scale=scale, key_mask=key_mask, backend=backend)[0]

    return ulysses_wrap(q, k, v, comm, layout.lengths, attend)
