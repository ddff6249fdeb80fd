"""SequenceLayout: how many tokens of one sequence each rank of a sequence-parallel group holds.

Rank r holds the contiguous slice `[offsets[r], offsets[r] + lengths[r])` of the full sequence. Lengths may
differ (a sequence of 45 tokens over 4 ranks is `(12, 11, 11, 11)`, the sizes `torch.tensor_split` gives),
so no rank pads and no token is computed twice. Every rank holds the same layout, so each one knows how much
every other rank sends without asking: the collectives never need a size exchange (and never a `.item()`).

For USP the layout is over all `ulysses x ring` ranks, in SP-rank order `ring_rank * U + ulysses_rank`:
`row(ring_rank, U)` gives one Ulysses group's lengths and `rows(U)` the lengths the Ring then sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SequenceLayout:
    """Positional on purpose (`SequenceLayout((12, 11, 11, 11))`): it is a value, not a config."""

    lengths: tuple[int, ...]
    """Tokens held by each rank of the group, in group-rank order; zero is allowed, negative is not."""

    def __post_init__(self) -> None:
        lengths = tuple(self.lengths)
        if not lengths:
            raise ValueError("SequenceLayout needs one length per rank, got none; e.g. SequenceLayout.split(45, 4)")
        for value in lengths:
            # a SymInt: a compiled block's symbolic sequence size (`SequenceParallel.layout`)
            if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
                raise ValueError(
                    f"SequenceLayout lengths must be non-negative ints, got {lengths!r}; "
                    f"build it with SequenceLayout.split(total, parts)"
                )
        object.__setattr__(self, "lengths", lengths)

    @classmethod
    def split(cls, total: int, parts: int) -> SequenceLayout:
        """As even as possible, longer shards first: the sizes `torch.tensor_split(x, parts)` gives."""
        if parts < 1 or total < 0:
            raise ValueError(f"cannot split {total} tokens into {parts} parts; need total >= 0 and parts >= 1")
        base, extra = divmod(total, parts)
        return cls(tuple(base + (1 if r < extra else 0) for r in range(parts)))

    @property
    def parts(self) -> int:
        """Number of ranks."""
        return len(self.lengths)

    @property
    def total(self) -> int:
        """Full sequence length."""
        return sum(self.lengths)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Index of each rank's first token in the full sequence."""
        starts, at = [], 0
        for length in self.lengths:
            starts.append(at)
            at += length
        return tuple(starts)

    def shard(self, x: torch.Tensor, rank: int, dim: int = 1) -> torch.Tensor:
        """This rank's slice of a full-sequence tensor (a view): `(b, S, ...) -> (b, s_rank, ...)`."""
        return x.narrow(dim, self.offsets[rank], self.lengths[rank])

    def row(self, ring_rank: int, ulysses: int) -> SequenceLayout:
        """USP: the lengths held by the `ulysses` contiguous ranks of ring row `ring_rank`."""
        self._check_grid(ulysses)
        return SequenceLayout(self.lengths[ring_rank * ulysses : (ring_rank + 1) * ulysses])

    def rows(self, ulysses: int) -> SequenceLayout:
        """USP: the sequence each ring row holds once Ulysses has gathered it (one length per ring rank)."""
        self._check_grid(ulysses)
        return SequenceLayout(
            tuple(sum(self.lengths[j : j + ulysses]) for j in range(0, self.parts, ulysses))
        )

    def _check_grid(self, ulysses: int) -> None:
        if ulysses < 1 or self.parts % ulysses:
            raise ValueError(
                f"a layout over {self.parts} ranks cannot be cut into Ulysses groups of {ulysses}; "
                f"the layout must have ulysses x ring lengths"
            )

    def check(self, group_size: int, rank: int, seq_len: int, what: str) -> None:
        """Raise ValueError unless this layout fits a group of `group_size` and rank holds `seq_len` tokens."""
        if self.parts != group_size:
            raise ValueError(
                f"{what}: the layout has {self.parts} lengths but the group has {group_size} ranks; "
                f"use SequenceLayout.split(total, {group_size})"
            )
        if self.lengths[rank] != seq_len:
            raise ValueError(
                f"{what}: rank {rank} holds {seq_len} tokens but the layout {self.lengths} gives it "
                f"{self.lengths[rank]}; cut the input with layout.shard(x, rank)"
            )


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, what: str) -> None:
    """Sequence-parallel self-attention takes q, k, v of one shape and dtype, (b, s_rank, h, d)."""
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape or not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"{what}: q, k, v must share one (batch, seq, heads, head_dim) shape and dtype, got "
            f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}, {tuple(v.shape)} {v.dtype}; "
            f"replicated text K/V (cross-attention) needs no sequence parallel: call local_attention"
        )
