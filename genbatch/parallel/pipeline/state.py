"""PipeState: one denoiser's PipeFusion state of one job on one rank: the running patch, where its tokens sit,
and every attention call's K/V buffer.

A synchronous step runs whole forwards (the warm-up: the whole latent goes stage to stage, exactly). An
asynchronous step runs one forward per patch: the image streams keep only the patch's tokens (whole token rows,
patches of `SequenceLayout.split(rows, patches)` rows), the text streams stay whole, and each self- or
joint-attention call writes its fresh K/V into its buffer (every token of the sequence, natural order) and
attends to the whole buffer: the patches before this one are this step's, those after it the step before's.

An image stream may hold several grids one after the other (`TokenGrid`: the output's noise, then a
conditioning image's latent tokens, FLUX.1 Kontext's and Qwen-Image-Edit's): patch i then holds the i-th share
of whole rows of each, two or more ranges of the stream (`patch_ranges`), cut out and put back together.

With Ring inside a stage each ring rank's buffer keeps the keys its Ulysses row holds in the patch forwards (its
part of every patch), and the patch's queries attend to every ring rank's buffer around the ring
(`BufferSlots`); a whole forward gathers its keys over the ring once, attends exactly and keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genbatch.models.hooks import TokenGrid
from genbatch.parallel.attention.layout import SequenceLayout

Ranges = tuple[tuple[int, int], ...]
"""(start, count) ranges of an image stream, in stream order: where one patch's tokens sit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BufferSlots:
    """Where one attention call's keys go in a ring rank's K/V buffer (with Ulysses alone, one rank of the ring:
    the buffer is the whole sequence in natural order, and a slot is a key's position in it)."""

    fresh: torch.Tensor
    """The slot of each key this rank's Ulysses row gathered in the running forward (patch forwards: all kept)."""
    kept: torch.Tensor
    """Of a whole forward's keys gathered over the ring as well (SP-rank order), the ones this buffer keeps..."""
    kept_slots: torch.Tensor
    """...and their slots."""
    lengths: tuple[int, ...]
    """Every ring rank's buffer length (what the ring passes around)."""


@dataclass(kw_only=True, slots=True)
class PipeState:
    patches: int
    """Patches an asynchronous step splits the image tokens into."""
    grids: tuple[TokenGrid, ...]
    """The image stream's grids in stream order, the output's noise first (patches hold whole rows of each)."""
    text_streams: frozenset[str]
    """The split streams that stay whole in a patch forward (the text)."""
    naive: bool = False
    """The baseline: a patch attends to its own keys (and the text's) only, no buffers."""
    sync: bool = True
    """Whether the running step is synchronous (whole forwards)."""
    patch: int | None = None
    """The patch of the running forward (None: the whole sequence)."""
    branch: str = ""
    """The guidance branch of the running forward."""
    calls: int = 0
    """Attention calls made so far by the running forward."""
    windows: dict[str, tuple[int, Ranges]] = field(default_factory=dict)
    """Stream -> (its full length, the ranges this forward's tokens come from), for the streams a patch forward
    cuts."""
    lengths: dict[str, int] = field(default_factory=dict)
    """Stream -> its tokens in the running forward (before the sequence-parallel split), noted at each cut: what
    the attention calls place their keys by (read at run time, so a compiled block does not guard on them)."""
    buffers: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """(branch, attention call index) -> that call's K and V of every token, (b, S, h, d)."""
    _positions: dict[tuple, tuple[torch.Tensor, int]] = field(default_factory=dict)

    def begin(self, branch: str, patch: int | None) -> None:
        """A forward of `branch` starts, on `patch` (None: whole)."""
        self.branch, self.patch, self.calls = branch, patch, 0
        self.windows.clear()
        self.lengths.clear()

    @property
    def image_tokens(self) -> int:
        """Tokens of an image stream: every grid's."""
        return sum(grid.tokens for grid in self.grids)

    def patch_ranges(self, patch: int) -> Ranges:
        """(start, count) of `patch`'s tokens in an image stream, one range per grid: its share of the grid's
        whole rows (`SequenceLayout.split` of the rows, longer shares first)."""
        ranges, base = [], 0
        for grid in self.grids:
            rows = SequenceLayout.split(grid.tokens // grid.row_tokens, self.patches)
            ranges.append((base + rows.offsets[patch] * grid.row_tokens, rows.lengths[patch] * grid.row_tokens))
            base += grid.tokens
        return tuple(ranges)

    def cut(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        """A split value in a patch forward: an image stream keeps the patch's tokens (recorded in `windows`)."""
        total = self.lengths[stream] = tensor.shape[dim]
        if self.patch is None or stream in self.text_streams:
            return tensor
        if total != self.image_tokens:
            raise RuntimeError(f"PipeFusion: image stream {stream} has {total} tokens, and the job's grids "
                               f"{self.grids} make {self.image_tokens}; a family whose image stream carries more "
                               "than the noise must declare the rest (`FamilyHooks.conditioning_grids`)")
        ranges = self.patch_ranges(self.patch)
        self.windows[stream] = (total, ranges)
        self.lengths[stream] = sum(count for _, count in ranges)
        # (..., S, ...) -> (..., S_patch, ...): the patch's rows of each grid, in stream order
        return torch.cat([tensor.narrow(dim, start, count) for start, count in ranges], dim=dim)

    def place(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        """A gathered output in a patch forward: the patch's tokens at their place in a whole-length tensor
        (zeros elsewhere), so the model's own unpatchify runs on it."""
        if self.patch is None:
            return tensor
        total, ranges = self.windows[stream]
        shape = list(tensor.shape)
        shape[dim] = total
        whole = tensor.new_zeros(shape)  # (..., S_patch, ...) -> (..., S, ...): each range back at its place
        taken = 0
        for start, count in ranges:
            whole.narrow(dim, start, count).copy_(tensor.narrow(dim, taken, count))
            taken += count
        return whole

    def next_call(self) -> tuple[str, int]:
        key = (self.branch, self.calls)
        self.calls += 1
        return key

    def counted(self, streams: tuple[str, ...], site: str) -> tuple[tuple[str, int], ...]:
        """(stream, its tokens in the running forward) for an attention call's streams."""
        missing = [name for name in streams if name not in self.lengths]
        if missing:
            raise RuntimeError(f"{site}: no split point of stream(s) {', '.join(missing)} ran in this forward, so "
                               "PipeFusion cannot place its keys; the model's sequence splits must split every stream "
                               "its attention calls attend over")
        return tuple((name, self.lengths[name]) for name in streams)

    def positions(self, streams: tuple[tuple[str, int], ...], ranks: int, device,
                  sp_ranks: range | None = None) -> tuple[torch.Tensor, int]:
        """(the whole-sequence position of each key the attention gathered, the sequence's length): the keys come
        in SP-rank order (rank 0's piece of each stream, in the call's stream order, then rank 1's...) over the
        `ranks` sequence ranks of the stage, of those in `sp_ranks` (default: all of them: Ulysses alone, or a
        whole forward gathered over the ring too); the whole sequence holds each stream at full length, one
        after the other."""
        sp_ranks = range(ranks) if sp_ranks is None else sp_ranks
        key = (streams, ranks, sp_ranks, tuple(sorted(self.windows.items())), device)
        cached = self._positions.get(key)
        if cached is not None:
            return cached
        pieces, bases, base = [], [], 0
        for name, count in streams:
            full, ranges = self.windows.get(name, (count, ((0, count),)))
            bases.append((base + _positions_of(ranges), SequenceLayout.split(count, ranks)))
            base += full
        for rank in sp_ranks:
            for where, layout in bases:  # the forward's tokens of the stream, as the sequence split cuts them
                pieces.append(where[layout.offsets[rank] : layout.offsets[rank] + layout.lengths[rank]])
        found = self._positions[key] = (torch.cat(pieces).to(device), base)
        return found

    def owned(self, streams: tuple[tuple[str, int], ...], ulysses: int, ring: int, ring_rank: int) -> torch.Tensor:
        """The whole-sequence positions whose K/V ring rank `ring_rank`'s buffer keeps, ascending: the keys its
        Ulysses row holds in the patch forwards (its part of every patch of each image stream, and of each text
        stream), the same in every forward of the job (a whole forward keeps these of its gathered keys)."""
        ranks, row = ulysses * ring, range(ring_rank * ulysses, (ring_rank + 1) * ulysses)
        pieces, base = [], 0
        for name, count in streams:
            full = self.windows.get(name, (count, ()))[0]
            cut = name not in self.text_streams
            windows = [self.patch_ranges(patch) for patch in range(self.patches)] if cut else [((0, full),)]
            for ranges in windows:
                where = base + _positions_of(ranges)
                layout = SequenceLayout.split(len(where), ranks)
                for rank in row:
                    pieces.append(where[layout.offsets[rank] : layout.offsets[rank] + layout.lengths[rank]])
            base += full
        return torch.cat(pieces).sort().values

    def slots(self, streams: tuple[tuple[str, int], ...], ulysses: int, ring: int, ring_rank: int,
              device) -> BufferSlots:
        """Where the keys of the running forward go in ring rank `ring_rank`'s buffer (`BufferSlots`)."""
        key = ("slots", streams, ulysses, ring, ring_rank, tuple(sorted(self.windows.items())), device)
        cached = self._positions.get(key)
        if cached is not None:
            return cached
        owned = [self.owned(streams, ulysses, ring, rank) for rank in range(ring)]
        whole = self.positions(streams, ulysses * ring, "cpu")[1]
        local = torch.full((whole,), -1, dtype=torch.long)  # whole-sequence position -> slot in this buffer
        local[owned[ring_rank]] = torch.arange(len(owned[ring_rank]))
        row = range(ring_rank * ulysses, (ring_rank + 1) * ulysses)
        fresh = local[self.positions(streams, ulysses * ring, "cpu", row)[0]]
        gathered = local[self.positions(streams, ulysses * ring, "cpu")[0]]  # every rank's keys, SP-rank order
        kept = (gathered >= 0).nonzero().view(-1)
        found = self._positions[key] = BufferSlots(
            fresh=fresh.to(device), kept=kept.to(device), kept_slots=gathered[kept].to(device),
            lengths=tuple(len(positions) for positions in owned))
        return found

    def held_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.buffers.values())

    def clear(self) -> None:
        self.buffers.clear()
        self._positions.clear()


def _positions_of(ranges: Ranges) -> torch.Tensor:
    """The stream positions of the tokens `ranges` cover, in order."""
    return torch.cat([torch.arange(start, start + count) for start, count in ranges])
