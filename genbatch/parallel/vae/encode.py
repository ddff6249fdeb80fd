"""Encode an image or video on every rank of a group, one tile each, and gather the latent on every rank.

    dist = parallel_encode(vae, video, comm)       # vae.encode(video).latent_dist, on every rank
    with parallel_encoding(vae, comm):             # the pipeline's own vae.encode calls, tiled
        pipe.prepare_latents(...)

The pixels are cut by the grid of the latent they become (`tile_grid` in latent coordinates, times the VAE's
spatial factor), so every tile edge is a multiple of each downsampling's stride. Each rank encodes its tile
with the encoder's halos (and, before each stride-2 convolution, the row and column the whole image's pad
would read, from the neighbours) and its mid-block attention made global (see `forwards.py`): the latent equals a
one-rank encode within floating-point rounding while each rank holds about 1/p of the activations, the part of an
image-to-video job at 720p that does not fit one GPU otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from genbatch.parallel.comm import Comm
from genbatch.parallel.vae.context import TileGroup
from genbatch.parallel.vae.forwards import encoder_parts, tile_parallel, unsupported_reason
from genbatch.parallel.vae.tiles import tile_grid


def spatial_factor(vae: nn.Module) -> int | None:
    """Pixels per latent pixel along each side: Wan's `spatial_compression_ratio`, an AutoencoderKL's 2 per
    downsampling block; None when the VAE says neither."""
    factor = getattr(vae, "spatial_compression_ratio", None)
    if factor is None and getattr(getattr(vae, "config", None), "block_out_channels", None):
        factor = 2 ** (len(vae.config.block_out_channels) - 1)
    return factor


def unsupported_encode_reason(vae: nn.Module) -> str | None:
    """Why `vae` cannot be encoded tile-parallel (naming the first module in the way), or None if it can."""
    if spatial_factor(vae) is None:
        return f"{type(vae).__name__} does not say its spatial compression"
    return unsupported_reason(vae, encoder_parts)


def supports_parallel_encode(vae: nn.Module) -> bool:
    return unsupported_encode_reason(vae) is None


@torch.no_grad()
def parallel_encode(vae: nn.Module, video: torch.Tensor, comm: Comm):
    """`vae.encode(video).latent_dist`, computed by every rank of `comm`'s group on its own tile of the pixels;
    the whole distribution on every rank. One rank, an unsupported VAE, or pixels too small to share: the
    plain encode."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    def whole(x):  # the class's own encode (the instance's may be `parallel_encoding`'s)
        return type(vae).encode(vae, x).latent_dist

    factor = spatial_factor(vae)
    height, width = video.shape[-2:]
    if comm.size == 1 or unsupported_encode_reason(vae) is not None or height % factor or width % factor:
        return whole(video)
    grid = tile_grid(height // factor, width // factor, comm.size)
    if grid is None:  # fewer latent rows and columns than ranks to share them
        return whole(video)
    group = TileGroup(comm=comm, grid=grid)
    top, bottom, left, right = grid.bounds(comm.rank)
    tile = video[..., top * factor:bottom * factor, left * factor:right * factor].contiguous()
    with tile_parallel(vae, group, encoder_parts):
        moments = whole(tile).parameters  # (b, 2 z, f, h_tile, w_tile): mean and log variance
    del tile
    return DiagonalGaussianDistribution(group.gather_full(moments))


@contextmanager
def parallel_encoding(vae: nn.Module | None, comm: Comm) -> Iterator[None]:
    """Within the block, `vae.encode(x)` encodes tile-parallel over `comm`'s group (every rank of which must make
    the same calls): for a pipeline's own `prepare_latents`. Nothing changes without a VAE or for one rank; an
    unsupported VAE is found at its first encode (`parallel_encode`), so a job that encodes nothing pays nothing."""
    if vae is None or comm.size == 1:
        yield
        return
    from diffusers.models.modeling_outputs import AutoencoderKLOutput

    def encode(x, return_dict: bool = True):
        dist = parallel_encode(vae, x, comm)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    previous = vae.__dict__.get("encode")
    vae.encode = encode
    try:
        yield
    finally:
        if previous is None:
            del vae.encode
        else:
            vae.encode = previous
