"""SequenceGroup: the sequence-parallel group as two axes, Ulysses inside and Ring across."""

from __future__ import annotations

from dataclasses import dataclass

from genbatch.parallel.comm import Comm


@dataclass(slots=True)
class SequenceGroup:
    """The SP group as two axes: Ulysses inside, Ring across (SP rank = ring_rank * U + ulysses_rank)."""

    ulysses: Comm
    """The ranks that exchange heads with all-to-alls (contiguous SP ranks)."""
    ring: Comm
    """The ranks that pass K/V blocks around (same Ulysses rank, every ring row)."""
    sp: Comm
    """All ring x ulysses ranks, in SP-rank order (for the split/gather of whole sequences)."""
    kernel: str = "auto"
    """The local attention backend each rank runs on its part (`genbatch.parallel.attention.local.BACKENDS`)."""

    @property
    def size(self) -> int:
        return self.ulysses.size * self.ring.size

    @property
    def rank(self) -> int:
        return self.ring.rank * self.ulysses.size + self.ulysses.rank
