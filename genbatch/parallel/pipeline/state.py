"""PipeState: one denoiser's PipeFusion state of one job on one rank: the running patch, where its tokens sit,
and every attention call's K/V buffer.

A synchronous step runs whole forwards (the warm-up: the whole latent goes stage to stage, exactly). An
asynchronous step runs one forward per patch: the image streams keep only the patch's tokens (whole token rows,
patches of `SequenceLayout.split(rows, patches)` rows), the text streams stay whole, and each self- or
joint-attention call writes its fresh K/V into its buffer (every token of the sequence, natural order) and
attends to the whole buffer: the patches before this one are this step's, those after it the step before's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genbatch.parallel.attention.layout import SequenceLayout


@dataclass(kw_only=True, slots=True)
class PipeState:
    patches: int
    """Patches an asynchronous step splits the image tokens into."""
    row_tokens: int
    """Tokens in one row of the latent (patches hold whole rows)."""
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
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Stream -> (its full length, where this forward's tokens start), for the streams a patch forward cuts."""
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

    def patch_range(self, total: int, patch: int) -> tuple[int, int]:
        """(start, count) of `patch`'s tokens in a stream of `total` image tokens."""
        rows = SequenceLayout.split(total // self.row_tokens, self.patches)
        return rows.offsets[patch] * self.row_tokens, rows.lengths[patch] * self.row_tokens

    def cut(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        """A split value in a patch forward: an image stream keeps the patch's tokens (recorded in `windows`)."""
        total = self.lengths[stream] = tensor.shape[dim]
        if self.patch is None or stream in self.text_streams:
            return tensor
        start, count = self.patch_range(total, self.patch)
        self.windows[stream], self.lengths[stream] = (total, start), count
        return tensor.narrow(dim, start, count)

    def place(self, tensor: torch.Tensor, dim: int, stream: str) -> torch.Tensor:
        """A gathered output in a patch forward: the patch's tokens at their place in a whole-length tensor
        (zeros elsewhere), so the model's own unpatchify runs on it."""
        if self.patch is None:
            return tensor
        total, start = self.windows[stream]
        shape = list(tensor.shape)
        shape[dim] = total
        whole = tensor.new_zeros(shape)
        whole.narrow(dim, start, tensor.shape[dim]).copy_(tensor)
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
                               "PipeFusion cannot place its keys; the model's sequence plan must split every stream "
                               "its attention calls attend over")
        return tuple((name, self.lengths[name]) for name in streams)

    def positions(self, streams: tuple[tuple[str, int], ...], ranks: int, device) -> tuple[torch.Tensor, int]:
        """(the buffer position of each key the attention gathered, the buffer's length): the keys come in
        Ulysses rank order (rank 0's piece of each stream, in the call's stream order, then rank 1's...); the
        buffer holds each stream at full length, one after the other."""
        key = (streams, ranks, tuple(sorted(self.windows.items())), device)
        cached = self._positions.get(key)
        if cached is not None:
            return cached
        pieces, bases, base = [], [], 0
        for name, count in streams:
            full, start = self.windows.get(name, (count, 0))
            bases.append((base + start, SequenceLayout.split(count, ranks)))
            base += full
        for rank in range(ranks):
            for first, layout in bases:
                at = first + layout.offsets[rank]
                pieces.append(torch.arange(at, at + layout.lengths[rank]))
        found = self._positions[key] = (torch.cat(pieces).to(device), base)
        return found

    def held_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.buffers.values())

    def clear(self) -> None:
        self.buffers.clear()
        self._positions.clear()
