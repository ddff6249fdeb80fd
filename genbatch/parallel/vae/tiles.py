"""How a latent is cut into one tile per rank of the decode group, and how the tiles join again.

Strips by height when the latent has at least as many rows as the group has ranks; otherwise a 2-D grid
(rows x cols = group size) with no empty tile. Splits may be uneven (7 rows over 4 ranks: 2, 2, 2, 1).
Rank r of the group holds grid cell (r // cols, r % cols). Pure data, no communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def split_bounds(length: int, parts: int) -> tuple[int, ...]:
    """Cut `length` into `parts` contiguous pieces, the first `length % parts` one longer; return the edges."""
    if parts < 1 or parts > length:
        raise ValueError(f"cannot split {length} rows over {parts} ranks; each rank needs at least one row")
    base, extra = divmod(length, parts)
    edges = [0]
    for index in range(parts):
        edges.append(edges[-1] + base + (1 if index < extra else 0))
    return tuple(edges)


@dataclass(frozen=True, slots=True, kw_only=True)
class TileGrid:
    """A grid of tiles over the last two dims (height, width) of a latent, one tile per group rank."""

    row_edges: tuple[int, ...]
    """Tile boundaries along the height: grid row i covers rows [row_edges[i], row_edges[i + 1])."""
    col_edges: tuple[int, ...]
    """Tile boundaries along the width: grid column j covers columns [col_edges[j], col_edges[j + 1])."""

    @property
    def rows(self) -> int:
        return len(self.row_edges) - 1

    @property
    def cols(self) -> int:
        return len(self.col_edges) - 1

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def cell(self, rank: int) -> tuple[int, int]:
        """(grid row, grid column) of a group rank."""
        return divmod(rank, self.cols)

    def bounds(self, rank: int) -> tuple[int, int, int, int]:
        """(row start, row end, column start, column end) of the rank's tile, in latent coordinates."""
        i, j = self.cell(rank)
        return self.row_edges[i], self.row_edges[i + 1], self.col_edges[j], self.col_edges[j + 1]

    def neighbors(self, rank: int) -> tuple[int | None, int | None, int | None, int | None]:
        """Group ranks of the (up, down, left, right) neighbours; None at the latent's border."""
        i, j = self.cell(rank)
        up = rank - self.cols if i > 0 else None
        down = rank + self.cols if i < self.rows - 1 else None
        left = rank - 1 if j > 0 else None
        right = rank + 1 if j < self.cols - 1 else None
        return up, down, left, right

    def scaled(self, factor: int) -> TileGrid:
        """The same grid on an image `factor` times larger in both dims (after the decoder's upsampling)."""
        return TileGrid(
            row_edges=tuple(edge * factor for edge in self.row_edges),
            col_edges=tuple(edge * factor for edge in self.col_edges),
        )

    def assemble(self, tiles: list[torch.Tensor]) -> torch.Tensor:
        """Join one tile per rank (in rank order) into the whole tensor; tiles' last two dims are (h, w)."""
        if len(tiles) != self.size:
            raise ValueError(f"got {len(tiles)} tiles for a grid of {self.size}; pass one tile per group rank")
        if self.cols == 1:
            return torch.cat(tiles, dim=-2)
        bands = [torch.cat(tiles[i * self.cols : (i + 1) * self.cols], dim=-1) for i in range(self.rows)]
        return torch.cat(bands, dim=-2)


def tile_grid(height: int, width: int, ranks: int) -> TileGrid | None:
    """The grid for a `height` x `width` latent over `ranks` ranks, or None when no grid leaves every tile non-empty.

    Strips by height when height >= ranks; otherwise the factorisation rows x cols = ranks with the most rows
    (the fewest width cuts) that fits.
    """
    if ranks < 1:
        raise ValueError(f"ranks={ranks}: a decode group has at least one rank")
    for rows in range(min(ranks, height), 0, -1):
        if ranks % rows == 0 and ranks // rows <= width:
            return TileGrid(row_edges=split_bounds(height, rows), col_edges=split_bounds(width, ranks // rows))
    return None
