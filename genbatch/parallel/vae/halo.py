"""Convolutions on a tile that give exactly the whole image's result: halo rows from the neighbours.

A k x k convolution with zero padding p = k // 2 (times the dilation) is first run on the tile alone,
with its own zero padding: every output pixel more than p away from a tile edge that has a neighbour is
already right. Then the p-wide bands along those edges are computed again from small windows that include
the neighbours' halo rows and columns, and written over the wrong ones. No copy of the whole tile is made,
so a tile-parallel decoder holds no more than the plain one per pixel.

Halos travel in two rounds so the corner pixels arrive too: first rows with the up/down neighbours, then
columns of the row-extended tile with the left/right neighbours (2-D grids only).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from genbatch.parallel.vae.context import TileGroup

ConvFn = Callable[[torch.Tensor, int, int], torch.Tensor]
"""`conv(x, pad_h, pad_w)`: the layer's convolution of x with that zero padding on its last two dims."""


def convolution(x, weight, bias, stride, padding, dilation, groups) -> torch.Tensor:
    """`F.conv2d` / `F.conv3d` (by x's rank); fp32 on CPU goes to oneDNN directly.

    torch only picks oneDNN on CPU when N*C*D*H > 20480 (width ignored), so a thin strip of a 3-D activation
    drops to the reference kernel, several times slower than the whole frame was: tiles would cost more
    than the image they are cut from.
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        return torch.mkldnn_convolution(x, weight, bias, padding, stride, dilation, groups)
    conv = F.conv3d if x.dim() == 5 else F.conv2d
    return conv(x, weight, bias, stride, padding, dilation, groups)


def _swap(group: TileGroup, first: torch.Tensor, last: torch.Tensor, before: int | None, after: int | None, shape):
    """Send `first` to rank `before` and `last` to rank `after`; receive tensors of `shape` from them.

    Returns what came (before, after), zeros of `shape` where there is no neighbour (the image border).
    """
    got_before = first.new_empty(shape) if before is not None else first.new_zeros(shape)
    got_after = last.new_empty(shape) if after is not None else last.new_zeros(shape)
    sends, recvs = [], []
    if before is not None:
        sends.append((first.contiguous(), before))
        recvs.append((got_before, before))
    if after is not None:
        sends.append((last.contiguous(), after))
        recvs.append((got_after, after))
    for work in group.comm.exchange(sends, recvs):
        work.wait()
    return got_before, got_after


def _take(pieces: list[torch.Tensor], start: int, stop: int, dim: int) -> torch.Tensor:
    """Rows [start, stop) along `dim` of the pieces as if they were concatenated along it."""
    parts, offset = [], 0
    for piece in pieces:
        length = piece.shape[dim]
        lo, hi = max(start, offset), min(stop, offset + length)
        if lo < hi:
            parts.append(piece.narrow(dim, lo - offset, hi - lo))
        offset += length
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


class _Extended:
    """The tile with its halos, (h + 2 ph) x (w + 2 pw), never materialised whole: windows are cut from pieces."""

    def __init__(self, group: TileGroup, x: torch.Tensor, ph: int, pw: int):
        up, down, left, right = group.neighbors
        h, w = x.shape[-2:]
        if h < ph or w < pw:
            raise ValueError(
                f"a {h}x{w} tile is thinner than the {ph}x{pw} halo of a convolution; "
                "decode with fewer ranks (or a larger latent) so every tile is at least as wide as the halo"
            )
        self.x, self.ph, self.pw = x, ph, pw
        lead = x.shape[:-2]
        # round 1, rows: (..., ph, w) from the up and down neighbours
        shape = (*lead, ph, w)
        if ph == 0:
            self.top, self.bottom = x.new_zeros(shape), x.new_zeros(shape)
        else:
            self.top, self.bottom = _swap(group, x[..., :ph, :], x[..., h - ph :, :], up, down, shape)
        # round 2, columns of the row-extended tile: (..., h + 2ph, pw), corners included
        shape = (*lead, h + 2 * ph, pw)
        if pw == 0 or (left is None and right is None):
            self.left, self.right = x.new_zeros(shape), x.new_zeros(shape)
        else:
            columns = [self.top, x, self.bottom]
            first = _take([c[..., :pw] for c in columns], 0, h + 2 * ph, -2)
            last = _take([c[..., w - pw :] for c in columns], 0, h + 2 * ph, -2)
            self.left, self.right = _swap(group, first, last, left, right, shape)

    def window(self, row0: int, row1: int, col0: int, col1: int) -> torch.Tensor:
        """Rows [row0, row1) and columns [col0, col1) of the extended tile (halo coordinates start at 0)."""
        x, pw = self.x, self.pw
        w = x.shape[-1]
        parts = []
        if col0 < pw:
            parts.append(self.left[..., row0:row1, col0 : min(col1, pw)])
        lo, hi = max(col0, pw) - pw, min(col1, pw + w) - pw
        if lo < hi:
            parts.append(_take([c[..., lo:hi] for c in (self.top, x, self.bottom)], row0, row1, -2))
        if col1 > pw + w:
            parts.append(self.right[..., row0:row1, max(col0, pw + w) - pw - w : col1 - pw - w])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def halo_conv(group: TileGroup, x: torch.Tensor, conv: ConvFn, ph: int, pw: int) -> torch.Tensor:
    """`conv` over this rank's tile `x` (..., h, w), exactly as over the whole image with zero padding (ph, pw)."""
    out = conv(x, ph, pw)
    up, down, left, right = group.neighbors
    fix_rows = ph > 0 and (up is not None or down is not None)
    fix_cols = pw > 0 and (left is not None or right is not None)
    if not (fix_rows or fix_cols):
        return out
    ext = _Extended(group, x, ph, pw)
    h, w = x.shape[-2:]
    full_h, full_w = h + 2 * ph, w + 2 * pw
    rows, cols = min(ph, h), min(pw, w)
    # each band: a window 3p wide around the edge, convolved without padding -> the p edge rows/columns
    if ph > 0 and up is not None:
        out[..., :rows, :] = conv(ext.window(0, min(3 * ph, full_h), 0, full_w), 0, 0)
    if ph > 0 and down is not None:
        out[..., h - rows :, :] = conv(ext.window(max(0, full_h - 3 * ph), full_h, 0, full_w), 0, 0)
    if pw > 0 and left is not None:
        out[..., :, :cols] = conv(ext.window(0, full_h, 0, min(3 * pw, full_w)), 0, 0)
    if pw > 0 and right is not None:
        out[..., :, w - cols :] = conv(ext.window(0, full_h, max(0, full_w - 3 * pw), full_w), 0, 0)
    return out


def _from_next(group: TileGroup, first: torch.Tensor, before: int | None, after: int | None, shape) -> torch.Tensor:
    """Send `first` to rank `before`; receive a tensor of `shape` from rank `after` (zeros at the border)."""
    got = first.new_empty(shape) if after is not None else first.new_zeros(shape)
    sends = [(first.contiguous(), before)] if before is not None else []
    recvs = [(got, after)] if after is not None else []
    for work in group.comm.exchange(sends, recvs):
        work.wait()
    return got


def pad_from_after(group: TileGroup, x: torch.Tensor) -> torch.Tensor:
    """`ZeroPad2d((0, 1, 0, 1))` of the whole image, on this rank's tile `x` (..., h, w): one row more below, the
    first row of the tile under it, and one column more to the right, the first column of the tile beside it
    (the corner from that tile's own row below); zeros only at the image's border. A stride-2 convolution
    on the result gives exactly this tile's rows of the whole image's (its edges even)."""
    up, down, left, right = group.neighbors
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    rows = torch.cat([x, _from_next(group, x[..., :1, :], up, down, (*lead, 1, w))], dim=-2)  # (..., h + 1, w)
    beside = _from_next(group, rows[..., :, :1], left, right, (*lead, h + 1, 1))
    return torch.cat([rows, beside], dim=-1)  # (..., h + 1, w + 1)


def extended_tile(group: TileGroup, x: torch.Tensor, ph: int, pw: int, reflect: bool = False) -> torch.Tensor:
    """This rank's tile `x` (..., h, w) with its halos, (..., h + 2 ph, w + 2 pw): the neighbours' rows and columns
    (corners included), and at the image's border zeros, or with `reflect` the image reflected as
    `padding_mode="reflect"` pads the whole image. A convolution without padding over it gives exactly this
    tile's part of the whole image's."""
    up, down, left, right = group.neighbors
    h, w = x.shape[-2:]
    tile = _Extended(group, x, ph, pw).window(0, h + 2 * ph, 0, w + 2 * pw).clone()
    if reflect:
        # padded[p - k] = x[k] (k = 1..p): rows first, then columns, corners reflected twice as F.pad does
        if ph and up is None:
            tile[..., :ph, :] = tile[..., ph + 1 : 2 * ph + 1, :].flip(-2)
        if ph and down is None:
            tile[..., h + ph :, :] = tile[..., h - 1 : h + ph - 1, :].flip(-2)
        if pw and left is None:
            tile[..., :, :pw] = tile[..., :, pw + 1 : 2 * pw + 1].flip(-1)
        if pw and right is None:
            tile[..., :, w + pw :] = tile[..., :, w - 1 : w + pw - 1].flip(-1)
    return tile


def replicate_extended(group: TileGroup, x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """This rank's tile `x` (..., h, w) extended by `ph` rows and `pw` columns on each side exactly as the whole
    image is by replicate padding: the neighbouring tiles' rows and columns inside the image, copies of the edge
    row or column only at its true border (corners included: rows first, then columns of the row-extended tile)."""
    up, down, left, right = group.neighbors
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    if h < ph or w < pw:
        raise ValueError(f"a {h}x{w} tile is thinner than the {ph}x{pw} halo of a convolution; decode with fewer "
                         "ranks (or a larger latent) so every tile is at least as wide as the halo")
    if ph:
        top, bottom = _swap(group, x[..., :ph, :], x[..., h - ph :, :], up, down, (*lead, ph, w))
        top = top if up is not None else x[..., :1, :].expand(*lead, ph, w)
        bottom = bottom if down is not None else x[..., h - 1 :, :].expand(*lead, ph, w)
        x = torch.cat([top, x, bottom], dim=-2)  # (..., h + 2 ph, w)
    if pw:
        rows = x.shape[-2]
        first, last = _swap(group, x[..., :pw], x[..., w - pw :], left, right, (*lead, rows, pw))
        first = first if left is not None else x[..., :1].expand(*lead, rows, pw)
        last = last if right is not None else x[..., w - 1 :].expand(*lead, rows, pw)
        x = torch.cat([first, x, last], dim=-1)  # (..., h + 2 ph, w + 2 pw)
    return x
