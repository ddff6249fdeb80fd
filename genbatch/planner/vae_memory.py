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
from dataclasses import dataclass

DECODE_MODES = ("full", "parallel", "tiled")
"""`full`: one rank decodes with the pipeline's own decode; `parallel`: patch-parallel over the job group (exact);
`tiled`: one rank decodes with the VAE's own tiling (blended tiles: not the full decode's output)."""
EXACT_MODES = ("parallel", "full")
"""The modes whose output is the pipeline's own decode, in the order `auto` prefers them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecoderMemory:
    """How one VAE class's decoder holds memory while it decodes."""

    vae_class: str
    """The diffusers class name."""
    channels: int
    """Output-side channel width of the config the constants below were counted on (a decoder's activations
    scale with it)."""
    values_per_pixel: float
    """Live values per output pixel and per output frame of the chunk decoded at once, at the peak."""
    values_per_area: float
    """Live values per output pixel that do not grow with the chunk (feature caches of causal convolutions)."""
    frames_at_once: int | None
    """Output frames decoded at once without tiling; None: every frame (an image VAE: one)."""
    output_copies: float
    """Whole decoded outputs alive at the peak of a full decode (the result, and a concatenation's copy)."""
    tile: tuple[int, int] | None
    """(height, width) in output pixels of one tile with the VAE's own tiling; None: it cannot tile."""
    tiled_output_copies: float = 1.0
    """Whole outputs alive at a tiled decode's peak (the decoded tiles, their overlaps, the blended rows)."""
    full_work: float = 1.0
    """Decoder work of a full decode over one plain pass (overlapping temporal tiles decode frames twice)."""
    tiled_work: float = 1.0
    """Decoder work of a tiled decode over one plain pass: the tiles' overlaps are decoded twice."""
    mask_compression: tuple[int, int] | None = None
    """(spatial, temporal) compression of a decoder whose mid-block attention builds one mask over every pair of
    latent tokens it decodes at once (HunyuanVideo 1.5's: (frames x h x w)^2 values beside the activations, in full
    and tiled decodes; genbatch's patch-parallel attention builds none); None: no such mask."""

    def work(self, mode: str) -> float:
        """Decoder work in `mode` over one plain pass of the whole output."""
        return self.tiled_work if mode == "tiled" and self.tile is not None else self.full_work

    def scale(self, channels: int | None) -> float:
        """How much larger a decoder of `channels` output-side channels is than the one measured."""
        return 1.0 if not channels else channels / self.channels


IMAGE = DecoderMemory(vae_class="AutoencoderKL", channels=128, values_per_pixel=768.0, values_per_area=0.0,
                      frames_at_once=1, output_copies=1.0, tile=(1024, 1024), tiled_output_copies=3.0,
                      tiled_work=(1 / 0.75) ** 2)
"""FLUX / SD3 (block_out_channels 128, 256, 512, 512; sample_size 1024): 6 x 128 values a pixel at the last
stage (3 GiB in fp32 at 1024x1024); tiles overlap by a quarter."""
WAN = DecoderMemory(vae_class="AutoencoderKLWan", channels=96, values_per_pixel=1040.0, values_per_area=732.0,
                    frames_at_once=4, output_copies=1.0, tile=(256, 256), tiled_output_copies=3.2,
                    tiled_work=(256 / 192) ** 2)
"""Wan 2.1 (base_dim 96): one latent frame (four output frames) at a time, the feature cache beside it."""
QWEN_IMAGE = DecoderMemory(vae_class="AutoencoderKLQwenImage", channels=96, values_per_pixel=1040.0,
                           values_per_area=732.0, frames_at_once=4, output_copies=1.0, tile=(256, 256),
                           tiled_output_copies=3.2, tiled_work=(256 / 192) ** 2)
"""Qwen-Image: Wan's decoder, decoding one frame."""
QWEN_IMAGE_21 = DecoderMemory(vae_class="AutoencoderKLQwenImage21", channels=144, values_per_pixel=3067.0,
                              values_per_area=0.0, frames_at_once=1, output_copies=1.0, tile=(256, 256),
                              tiled_output_copies=3.2, tiled_work=(256 / 192) ** 2)
"""Qwen-Image 2.1 (decoder_base_dim 144, dim_mult 1-2-4-8-8, RGBA out): one frame, no feature cache; counted 3,070
values a pixel at 512^2 and 1024^2 (its 4 output channels included), and 208M values tiled at 1024^2 (256-pixel
tiles every 192), on the meta device (bench/vae_memory.py's count)."""
HUNYUAN_VIDEO = DecoderMemory(vae_class="AutoencoderKLHunyuanVideo", channels=128, values_per_pixel=1160.0,
                              values_per_area=0.0, frames_at_once=17, output_copies=1.2, tile=(256, 256),
                              tiled_output_copies=1.35, full_work=17 / 12, tiled_work=17 / 12 * (256 / 192) ** 2)
"""HunyuanVideo (block_out_channels 128, 256, 512, 512): framewise decode (17-frame temporal tiles every 12 frames)
is diffusers' default; tiling adds 256-pixel spatial tiles every 192 pixels."""
COGVIDEOX = DecoderMemory(vae_class="AutoencoderKLCogVideoX", channels=128, values_per_pixel=2545.0,
                          values_per_area=0.0, frames_at_once=9, output_copies=1.0, tile=(240, 360),
                          tiled_output_copies=1.0, tiled_work=(1 / (1 - 1 / 6)) * (1 / (1 - 1 / 5)))
"""CogVideoX and CogVideoX 1.5 (block_out_channels 128, 256, 256, 512; sample 480x720): the first batch of three
latent frames (nine output frames) is the largest; tiles overlap by 1/6 of their height and 1/5 of their width."""

LTX2_VIDEO = DecoderMemory(vae_class="AutoencoderKLLTX2Video", channels=256, values_per_pixel=48.0,
                           values_per_area=0.0, frames_at_once=None, output_copies=1.0, tile=(512, 512),
                           tiled_output_copies=1.5, tiled_work=(512 / 448) ** 2)
"""LTX-2 (block_out_channels 256-2048, decoder 1024, 512, 256 halved by its upsamplers, 4x4 pixel patches): every
frame at once (diffusers' default, no framewise decode); its last stage runs 128 channels at a quarter of the
height and width, 8 values an output pixel and frame a tensor, about six alive in a resnet (48). Estimated from
the layout, not counted by bench/vae_memory.py; tiles of 512 pixels every 448."""

FLUX2 = DecoderMemory(vae_class="AutoencoderKLFlux2", channels=128, values_per_pixel=768.0, values_per_area=0.0,
                      frames_at_once=1, output_copies=1.0, tile=(1024, 1024), tiled_output_copies=3.0,
                      tiled_work=(1 / 0.75) ** 2)
"""FLUX.2 (`AutoencoderKLFlux2`, the published `AutoencoderKLFlux2()` config): diffusers' Decoder at FLUX.1's widths
(128, 256, 512, 512; three resnets a stage), so the image VAE's figures; its latent has 32 channels, which only
the first convolution sees."""

HUNYUAN_VIDEO15 = DecoderMemory(vae_class="AutoencoderKLHunyuanVideo15", channels=128, values_per_pixel=768.0,
                                values_per_area=0.0, frames_at_once=None, output_copies=1.0, tile=(256, 256),
                                tiled_output_copies=1.3, tiled_work=(256 / 192) ** 2, mask_compression=(16, 4))
"""HunyuanVideo 1.5 (block_out_channels 128, 256, 512, 1024, 1024; 16x spatial): every frame at once, 6 x 128 values a
pixel and frame at the last stage (counted 768.0 on the meta device from 128x128 x 9 to 256x256 x 5), beside its
mid-block mask over every pair of latent tokens; tiled, 256-pixel tiles every 192 pixels over every frame (counted
785 and 812 values a tile pixel with about 1.0 and 1.2 outputs at 768x512 and 1024x768 x 5)."""

DECODERS: dict[str, DecoderMemory] = {memory.vae_class: memory for memory in (
    IMAGE, WAN, QWEN_IMAGE, QWEN_IMAGE_21, HUNYUAN_VIDEO, COGVIDEOX, LTX2_VIDEO, FLUX2, HUNYUAN_VIDEO15)}
"""Every VAE class the planner models, by class name."""


def decoder_memory(vae_class: str, *, is_video: bool) -> DecoderMemory:
    """The model of `vae_class`; an unknown or unnamed class is taken for Wan's decoder (video) or the image VAE."""
    return DECODERS.get(vae_class) or (WAN if is_video else IMAGE)


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


__all__ = ["DECODERS", "DECODE_MODES", "EXACT_MODES", "DecoderMemory", "decode_peak_bytes", "decoder_memory",
           "first_fitting"]
