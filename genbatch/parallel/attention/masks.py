"""Key-padding masks for sequence-parallel attention, in the order the strategies read them.

A processor hands its attention call the mask it would use on one process. genbatch takes key-padding
masks only: bool, True where a key may be attended to, the same for every query. They come in two forms,
told apart by their key length:

    local   (b, s_keys_rank): the model built it from this rank's split inputs (Qwen-Image builds its
            joint mask inside the processor from the split text mask). All ranks' masks are gathered.
    full    (b, S): the model built it from the whole sequence before the split, its streams one after
            the other at full length (HunyuanVideo: [video, text]). Each rank cuts it into rank order
            with an index that depends only on the layout, so nothing is sent.

Either way the strategies receive (b, S) in SP-rank order: rank 0's keys (its slice of each stream, in the
attention's stream order), then rank 1's, and so on; that is the order Ulysses gathers the sequence in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.comm import Comm


def key_padding(attn_mask: torch.Tensor, batch: int, site: str) -> torch.Tensor:
    """A processor's `attn_mask` -> (b, keys) bool; ValueError naming the fix for any other kind of mask.

    Besides (b, keys) and (b, 1, 1, keys), a square (b, 1, s, s) bool mask that is the outer product of one
    per-token mask m (`m[i] & m[j]`: HunyuanVideo 1.5's processor builds its mask so, a padded token neither
    attending nor attended to) is taken as the key-padding mask m, its diagonal: a valid query's row is m, and a
    padded query's output is never read (no valid token attends to it)."""
    mask = attn_mask
    if mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0]  # (b, 1, 1, keys) -> (b, keys)
    elif mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == mask.shape[3] and mask.dtype == torch.bool:
        tokens = mask[:, 0].diagonal(dim1=-2, dim2=-1)  # (b, 1, s, s) -> (b, s)
        if not torch.compiler.is_compiling() and not torch.equal(mask[:, 0], tokens[:, :, None] & tokens[:, None, :]):
            raise ValueError(f"{site}: sequence-parallel attention takes a square (batch, 1, s, s) mask only as the "
                             "outer product of one per-token mask; run this model with --ulysses 1 --ring 1")
        mask = tokens
    elif mask.ndim == 3 and mask.shape[1] == 1:
        mask = mask[:, 0]  # (b, 1, keys) -> (b, keys)
    if mask.dtype != torch.bool or mask.ndim != 2 or mask.shape[0] not in (1, batch):
        raise ValueError(
            f"{site}: sequence-parallel attention takes boolean key-padding masks of shape (batch, keys) or "
            f"(batch, 1, 1, keys), got {mask.dtype} {tuple(attn_mask.shape)}; run this model with "
            f"--ulysses 1 --ring 1"
        )
    return mask.expand(batch, -1)


_INDEX_CACHE: dict[tuple, torch.Tensor] = {}
"""`rank_order_index` on a device, by (totals, parts, device): every masked attention of a forward asks for
the same one, and on a GPU each fresh index is a host-to-device copy."""
_INDEX_CACHE_SIZE = 64


def rank_order_index_on(totals: Sequence[int], parts: int, device: torch.device) -> torch.Tensor:
    """`rank_order_index` on `device`, built once per (totals, parts, device) outside compiled code (inside,
    the cache would be state dynamo guards on, so it is built in the graph)."""
    if torch.compiler.is_compiling():
        return rank_order_index(totals, parts).to(device)
    key = (tuple(totals), parts, device)
    index = _INDEX_CACHE.get(key)
    if index is None:
        if len(_INDEX_CACHE) >= _INDEX_CACHE_SIZE:
            _INDEX_CACHE.clear()
        index = _INDEX_CACHE[key] = rank_order_index(totals, parts).to(device)
    return index


def rank_order_index(totals: Sequence[int], parts: int) -> torch.Tensor:
    """Positions in the full [stream 0, stream 1, ...] order of the keys in SP-rank order (1-D int64)."""
    layouts = [SequenceLayout.split(total, parts) for total in totals]
    starts = [sum(totals[:i]) for i in range(len(totals))]
    pieces = [
        torch.arange(start + layout.offsets[rank], start + layout.offsets[rank] + layout.lengths[rank])
        for rank in range(parts)
        for start, layout in zip(starts, layouts)
    ]
    return torch.cat(pieces)


def gather_local(mask: torch.Tensor, sp: Comm, layout: SequenceLayout) -> torch.Tensor:
    """Every rank's local (b, s_rank) mask -> (b, S) in SP-rank order (one small all-gather)."""
    rows = mask.t().to(torch.uint8)  # (b, s_rank) -> (s_rank, b): gloo gathers no bool
    pieces = sp.all_gather_uneven(rows, layout.lengths, kind="sp_mask")
    return torch.cat(pieces, dim=0).t().bool()  # p x (s_r, b) -> (S, b) -> (b, S)


def rank_ordered(
    mask: torch.Tensor, totals: Sequence[int], layout: SequenceLayout, sp: Comm, site: str
) -> torch.Tensor:
    """A (b, keys) key-padding mask in either form -> (b, S) in SP-rank order."""
    keys = mask.shape[1]
    if keys == layout.lengths[sp.rank]:
        return gather_local(mask, sp, layout)
    if keys == layout.total:
        return mask.index_select(1, rank_order_index_on(totals, layout.parts, mask.device))
    raise ValueError(
        f"{site}: the attention mask covers {keys} keys, but this rank holds {layout.lengths[sp.rank]} of the "
        f"{layout.total} keys of its split streams; the model's sequence splits must split every input the "
        f"mask is built from"
    )
