"""Decode a latent on every rank of a group, one tile each, and join the image on the leader.

    image = parallel_decode(vae, latents, comm)            # the tensor vae.decode(latents).sample gives,
                                                           # on group rank 0; None on the others
    image = parallel_decode(vae, latents, comm, leader_only=False)   # ... on every rank

`latents` is what the pipeline hands to `vae.decode` (already un-normalised) and must be identical on every
rank. Each rank decodes its tile of the latent with the decoder's halos, norms and attention made global
(see `forwards.py`), so the result equals a one-rank decode within floating-point rounding (every layer adds the
same terms, tiles and all-gathered norm statistics in another order: not bit for bit) while each rank holds about
1/p of the activations.
"""

from __future__ import annotations

import torch
from torch import nn

from genbatch.parallel.comm import Comm
from genbatch.parallel.vae.context import TileGroup
from genbatch.parallel.vae.forwards import tile_parallel, unsupported_reason
from genbatch.parallel.vae.tiles import tile_grid


def _gather_to_leader(group: TileGroup, tile: torch.Tensor) -> torch.Tensor | None:
    """Send every rank's output tile to group rank 0, which writes them into the whole image one at a time."""
    comm = group.comm
    if comm.rank != 0:
        for work in comm.exchange([(tile.contiguous(), 0)], []):
            work.wait()
        return None
    grid = group.grid_at(tile)
    lead = tile.shape[:-2]
    image = tile.new_empty((*lead, grid.row_edges[-1], grid.col_edges[-1]))
    for rank in range(comm.size):
        top, bottom, left, right = grid.bounds(rank)
        if rank == 0:
            piece = tile
        else:
            piece = tile.new_empty((*lead, bottom - top, right - left))
            for work in comm.exchange([], [(piece, rank)]):
                work.wait()
        image[..., top:bottom, left:right] = piece
    return image


@torch.no_grad()
def parallel_decode(vae: nn.Module, latents: torch.Tensor, comm: Comm, *, leader_only: bool = True) -> torch.Tensor | None:
    """`vae.decode(latents).sample`, computed by every rank of `comm`'s group on its own tile of the latent.

    Returns the image on group rank 0 (and None on the others) when `leader_only`, else on every rank.
    Raises ValueError for a VAE `supports_parallel_decode` rejects; use `decode_fallback` for those.
    """
    if comm.size == 1:
        return vae.decode(latents).sample
    reason = unsupported_reason(vae)
    if reason is not None:
        raise ValueError(f"cannot decode tile-parallel: {reason}; use decode_fallback(vae, latents) instead")
    grid = tile_grid(latents.shape[-2], latents.shape[-1], comm.size)
    if grid is None:
        # a latent smaller than the group in every split: too small to share, decode it whole where needed
        return None if leader_only and comm.rank != 0 else vae.decode(latents).sample
    group = TileGroup(comm=comm, grid=grid)
    top, bottom, left, right = grid.bounds(comm.rank)
    tile_latents = latents[..., top:bottom, left:right].contiguous()
    with tile_parallel(vae, group):
        tile = vae.decode(tile_latents).sample
    del tile_latents
    if leader_only:
        return _gather_to_leader(group, tile)
    return group.gather_full(tile)


@torch.no_grad()
def decode_fallback(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """One-rank decode with the VAE's own tiling when it has one (`gen run --vae-decode tiled`), else plain.

    Tiling (diffusers' own, with blended overlaps) bounds the memory but is not the plain decode's output, so
    the runner takes it only when asked, or when no exact mode fits (`genbatch.runner.decode`).
    """
    if not hasattr(vae, "use_tiling"):
        return vae.decode(latents).sample
    use_tiling = vae.use_tiling
    vae.use_tiling = True
    try:
        return vae.decode(latents).sample
    finally:
        vae.use_tiling = use_tiling
