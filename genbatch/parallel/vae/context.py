"""One rank's place in a tile-parallel decode: the group's `Comm`, the tile grid, and the whole-tensor gather."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genbatch.parallel.comm import Comm
from genbatch.parallel.vae.tiles import TileGrid


@dataclass(frozen=True, slots=True, kw_only=True)
class TileGroup:
    """The decode group of this rank and the grid of latent tiles it decodes."""

    comm: Comm
    """The group's collectives (every byte the decode sends is counted in its ledger)."""
    grid: TileGrid
    """One tile per group rank, in latent coordinates; `scale` maps it to the current activation size."""

    def __post_init__(self) -> None:
        if self.grid.size != self.comm.size:
            raise ValueError(f"grid of {self.grid.size} tiles for a group of {self.comm.size} ranks; cut one tile per rank")

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def neighbors(self) -> tuple[int | None, int | None, int | None, int | None]:
        """Group ranks of the (up, down, left, right) neighbours, None at the border."""
        return self.grid.neighbors(self.rank)

    def grid_at(self, tile: torch.Tensor) -> TileGrid:
        """The grid scaled to the resolution of `tile`, this rank's tile of some activation (last dims h, w)."""
        top, bottom, left, right = self.grid.bounds(self.rank)
        factor, rest = divmod(tile.shape[-2], bottom - top)
        if rest or factor < 1 or tile.shape[-1] != factor * (right - left):
            raise ValueError(
                f"tile of shape {tuple(tile.shape)} is not an integer upscaling of the latent tile "
                f"{bottom - top}x{right - left}; only decoders that scale height and width alike are supported"
            )
        return self.grid.scaled(factor)

    def gather_full(self, tile: torch.Tensor) -> torch.Tensor:
        """All-gather every rank's tile of an activation and join them into the whole (..., H, W) tensor."""
        grid = self.grid_at(tile)
        lead = tile.shape[:-2]
        shapes = []
        for rank in range(grid.size):
            top, bottom, left, right = grid.bounds(rank)
            shapes.append((*lead, bottom - top, right - left))
        numels = [int(torch.Size(shape).numel()) for shape in shapes]
        # (..., h, w) -> (h * w * ...,): flat so tiles of any shape go through one uneven all-gather
        flat = self.comm.all_gather_uneven(tile.contiguous().view(-1), numels)
        # (numel_r,) -> (..., h_r, w_r) per rank
        return grid.assemble([piece.view(shape) for piece, shape in zip(flat, shapes)])
