"""Tile grids, the supported-VAE check and the peak-memory helper, in one process."""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from diffusers import AutoencoderKL, AutoencoderKLWan, AutoencoderTiny
from diffusers.models.attention_processor import AttnProcessor

from genbatch.parallel.vae import decode_fallback, peak_memory, supports_parallel_decode, unsupported_reason
from genbatch.parallel.vae.tiles import TileGrid, tile_grid, split_bounds
from genbatch.models.tiny_configs import TINY_FLUX_VAE, TINY_WAN_VAE


def test_split_bounds_uneven_first_longer():
    assert split_bounds(7, 4) == (0, 2, 4, 6, 7)
    assert split_bounds(13, 2) == (0, 7, 13)
    with pytest.raises(ValueError, match="at least one row"):
        split_bounds(3, 4)


@pytest.mark.parametrize(
    "height, width, ranks, rows, cols",
    [(7, 6, 4, 4, 1), (13, 2, 2, 2, 1), (3, 5, 4, 2, 2), (1, 7, 4, 1, 4), (2, 9, 6, 2, 3), (1, 3, 4, None, None)],
)
def test_tile_grid_prefers_strips_then_tiles(height, width, ranks, rows, cols):
    grid = tile_grid(height, width, ranks)
    if rows is None:
        assert grid is None
        return
    assert (grid.rows, grid.cols) == (rows, cols)
    covered = torch.zeros(height, width, dtype=torch.int64)
    for rank in range(ranks):
        top, bottom, left, right = grid.bounds(rank)
        assert bottom > top and right > left
        covered[top:bottom, left:right] += 1
    assert torch.equal(covered, torch.ones_like(covered))


def test_grid_neighbors_and_assemble():
    grid = TileGrid(row_edges=(0, 2, 3), col_edges=(0, 3, 5))
    assert grid.neighbors(0) == (None, 2, None, 1)
    assert grid.neighbors(3) == (1, None, 2, None)
    whole = torch.arange(2 * 6 * 10, dtype=torch.float32).view(2, 6, 10)
    scaled = grid.scaled(2)
    tiles = [whole[..., t:b, l:r] for t, b, l, r in (scaled.bounds(rank) for rank in range(4))]
    assert torch.equal(scaled.assemble(tiles), whole)


def test_supported_vaes():
    assert supports_parallel_decode(AutoencoderKLWan(**TINY_WAN_VAE))
    assert supports_parallel_decode(AutoencoderKL(**TINY_FLUX_VAE))


def test_unknown_layers_are_refused_with_the_module_named():
    tiny = AutoencoderTiny(decoder_block_out_channels=(8, 8, 8, 8), encoder_block_out_channels=(8, 8, 8, 8))
    assert not supports_parallel_decode(tiny)
    assert "AutoencoderTiny" in unsupported_reason(tiny)
    vae = AutoencoderKL(**TINY_FLUX_VAE)
    vae.decoder.mid_block.attentions[0].set_processor(AttnProcessor())
    assert "decoder.mid_block.attentions.0" in unsupported_reason(vae)
    offloaded = AutoencoderKL(**TINY_FLUX_VAE)
    add_hook_to_module(offloaded.decoder.conv_in, ModelHook())
    assert "decoder.conv_in" in unsupported_reason(offloaded)


def test_decode_fallback_tiles_and_restores_the_flag():
    vae = AutoencoderKL(**TINY_FLUX_VAE).eval()
    latents = torch.randn(1, 16, 12, 12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        vae.enable_tiling()
        tiled = vae.decode(latents).sample
        vae.disable_tiling()
        plain = vae.decode(latents).sample
    image = decode_fallback(vae, latents)
    assert torch.equal(image, tiled) and not torch.equal(image, plain)
    assert vae.use_tiling is False


def test_peak_memory_counts_live_tensors_made_inside():
    outside = torch.zeros(1000, 1000)  # 4 MB before the block: not counted
    with peak_memory("cpu") as peak:
        first = torch.ones(1000, 1000)  # 4 MB
        second = first * 2  # 8 MB live
        del first
        second.mul_(3)  # in place: nothing new
        view = second.view(-1)  # a view: nothing new
        third = torch.ones(500, 1000)  # 2 MB: 6 MB live
        outside.add_(1)
    assert peak.bytes == 8_000_000
    assert view.numel() == 1_000_000 and third.numel() == 500_000
