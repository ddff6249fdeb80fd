"""Each VAE's real decode peak, per decode mode: how diffusers' own decoders walk a video, not one untiled pass.

    decode_peak_bytes(WAN, "full", width=832, height=480, frames=81, ranks=1, bytes_per_value=4)

A decoder never holds the whole video's activations at once:
- Wan (`AutoencoderKLWan`, and Qwen-Image's `AutoencoderKLQwenImage`) decodes frame-causally: one latent frame
  (four output frames) at a time, with a cache of each causal convolution's last two frames.
- HunyuanVideo (`AutoencoderKLHunyuanVideo`) decodes framewise by default: temporal tiles of 17 output frames,
  blended; its tiling adds 256-pixel spatial tiles.
- CogVideoX (`AutoencoderKLCogVideoX`) decodes a few latent frames at a time with a convolution cache; its
  tiling cuts 240x360-pixel tiles (half its sample size).
- HunyuanVideo 1.5 (`AutoencoderKLHunyuanVideo15`) decodes every frame at once, and its mid-block attention builds
  a mask over every pair of latent tokens (`mask_compression`); its tiling cuts 256-pixel tiles over every frame.
- The image VAE (`AutoencoderKL`: FLUX, SD3, Z-Image; FLUX.2's `AutoencoderKLFlux2` has its decoder) decodes the
  whole image; its tiling cuts tiles of its sample size. Qwen-Image 2.1's (`AutoencoderKLQwenImage21`) decodes its one
  frame whole; its tiling cuts 256-pixel tiles.

So the peak is the activations of one chunk (`frames_at_once` output frames over the decoded area, `values_per_pixel`
live values per output pixel and frame, plus `values_per_area` per pixel that do not grow with the chunk: the
feature caches), plus the whole outputs alive at that moment (`output_copies`). Tiled, the area is one tile; patch
parallel (`genbatch.parallel.vae`), it is 1/p of the image on each rank, and the group's leader gathers the
whole output. The constants were counted on diffusers' decoders at their published configs with random weights
(live tensors under a dispatch mode, `bench/vae_memory.py`, whose output in bench/results/cpu/vae_memory.txt
compares this model with the count); a decoder of another width scales with its output-side channels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from genbatch.models.vae_costs import DecoderMemory

DECODE_MODES = ("full", "parallel", "tiled")
"""`full`: one rank decodes with the pipeline's own decode; `parallel`: patch-parallel over the job group (exact);
`tiled`: one rank decodes with the VAE's own tiling (blended tiles: not the full decode's output)."""
EXACT_MODES = ("parallel", "full")
"""The modes whose output is the pipeline's own decode, in the order `auto` prefers them."""


def first_fitting(modes: Sequence[str], needs: Callable[[str], float], limit: float) -> str:
    """`auto`'s rule: the first of `modes` (exact ones first) whose need fits in `limit`, else the one needing
    least (which then does not fit either)."""
    for mode in modes:
        if needs(mode) <= limit:
            return mode
    return min(modes, key=needs)


def _chunk_values(memory: DecoderMemory, frames: int, height: int, width: int) -> float:
    """Live activation values of the largest chunk one rank decodes over a `height` x `width` area (tiling keeps
    the frames decoded at once)."""
    chunk = frames if memory.frames_at_once is None else min(frames, memory.frames_at_once)
    return height * width * (memory.values_per_pixel * chunk + memory.values_per_area)


def _mask_values(memory: DecoderMemory, frames: int, height: int, width: int) -> float:
    """The values of a decoder's mid-block mask over every pair of latent tokens of a `height` x `width` x `frames`
    output decoded at once (0 for a decoder without one)."""
    if memory.mask_compression is None:
        return 0.0
    spatial, temporal = memory.mask_compression
    tokens = ((frames - 1) // temporal + 1) * -(-height // spatial) * -(-width // spatial)
    return float(tokens) ** 2


def decode_peak_bytes(memory: DecoderMemory, mode: str, *, width: int, height: int, frames: int | None,
                      ranks: int = 1, bytes_per_value: int = 2, channels: int | None = None,
                      tile: tuple[int, int] | None = None, leader: bool = True) -> float:
    """Peak bytes on one rank while decoding a `width` x `height` x `frames` output in `mode` over `ranks` ranks
    (the leader, which gathers the output, unless `leader` is False); `channels` and `tile` (height, width) describe
    a decoder configured otherwise than the published one the constants were counted on."""
    if mode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {mode!r}; choose one of {', '.join(DECODE_MODES)}")
    frames = max(frames or 1, 1)
    output = 3 * frames * height * width
    scale = memory.scale(channels)
    if mode == "parallel" and ranks > 1:
        # each rank decodes its strip (1/p of the area) exactly; the leader gathers the whole output
        share = (scale * _chunk_values(memory, frames, height, width) + memory.output_copies * output)
        values = share / ranks + (output if leader else 0.0)
    elif mode == "tiled" and (tile := tile or memory.tile) is not None:
        tile_h, tile_w = min(tile[0], height), min(tile[1], width)
        if (tile_h, tile_w) == (height, width):  # one tile: the VAE decodes it whole
            return decode_peak_bytes(memory, "full", width=width, height=height, frames=frames,
                                     bytes_per_value=bytes_per_value, channels=channels)
        values = scale * _chunk_values(memory, frames, tile_h, tile_w) + _mask_values(memory, frames, tile_h, tile_w)
        values += memory.tiled_output_copies * output
    else:  # full, a one-rank "parallel", or a VAE that cannot tile
        values = scale * _chunk_values(memory, frames, height, width) + memory.output_copies * output
        values += _mask_values(memory, frames, height, width)
    return values * bytes_per_value


__all__ = ["DECODE_MODES", "EXACT_MODES", "DecoderMemory", "decode_peak_bytes", "first_fitting"]
