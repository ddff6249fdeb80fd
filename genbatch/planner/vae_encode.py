"""Each VAE's real encode peak and work: what an image-conditioned row costs before its first denoising step.

    encode_peak_bytes(WAN_ENCODER, width=1280, height=720, frames=81, ranks=1, bytes_per_value=4)

A row that starts from an image runs the VAE encoder first (the runner's `parallel_encoding`, patch-parallel
over the job group where the VAE class decodes patch-parallel too, `ModelFamily.vae_classes`):
- Wan 2.1/2.2 I2V and FLF2V (`AutoencoderKLWan`) encode the whole conditioning video (the first frame, zeros,
  the last frame) at the output's size, frame-causally as diffusers does: the first frame alone, then four
  frames at a time, with a cache of each causal convolution's last frames; Wan 2.2 TI2V encodes the image alone.
- Qwen-Image-Edit (`AutoencoderKLQwenImage`, Wan's encoder), FLUX.1 Kontext (`AutoencoderKL`) and Qwen-Image 2.1
  (`AutoencoderKLQwenImage21`) encode the input image at its resized area.

The peak is the activations of one chunk (`frames_at_once` input frames over the encoded area, `values_per_pixel`
live values per input pixel and frame, plus `values_per_area` per pixel that do not grow with the chunk: the
feature caches) plus the whole input alive beside it (`input_copies`: the conditioning video the pipeline built).
Patch-parallel, each rank encodes a tile of 1/p of the area, and holds the whole input and its own tile of it
(`genbatch.parallel.vae.encode.parallel_encode` slices the tile from the whole input); the gathered latent is
2 z channels at 1/64 of the pixels, which no peak notices.

The constants were counted on diffusers' encoders at their published configs with random weights: live tensors
under a dispatch mode, the input built inside the count as the pipeline builds it, and FLOPs under torch's
`FlopCounterMode` (`bench/vae_memory.py`; its output, bench/results/cpu/vae_memory-encode.txt, compares this model
with the counts). On the meta device attention is decomposed into its math form, so a single large frame counts
its mid-block attention scores, which the fused kernels of a GPU and a CPU never hold: the constants are fitted
where those scores are negligible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderMemory:
    """How one VAE class's encoder holds memory and spends work while it encodes."""

    vae_class: str
    """The diffusers class name."""
    channels: int
    """Input-side channel width of the config the constants were counted on (activations scale with it)."""
    values_per_pixel: float
    """Live values per input pixel and per input frame of the chunk encoded at once, at the peak."""
    values_per_area: float
    """Live values per input pixel that do not grow with the chunk (the causal convolutions' feature caches)."""
    frames_at_once: int | None
    """Input frames encoded at once after the first (1 for an image VAE); None: every frame at once."""
    input_copies: float
    """Whole inputs (3 values per pixel and frame) alive during the encode: the tensor the pipeline built."""
    mflop_per_pixel: float
    """Encoder work per input pixel and frame after the first, MFLOP."""
    first_frame_mflop_per_pixel: float
    """Encoder work per pixel of the first frame (or the one image), MFLOP: a causal encoder pads it with
    copies of itself, so it costs more than the frames after it."""

    def scale(self, channels: int | None) -> float:
        """How much larger an encoder of `channels` input-side channels is than the one measured."""
        return 1.0 if not channels else channels / self.channels


IMAGE_ENCODER = EncoderMemory(vae_class="AutoencoderKL", channels=128, values_per_pixel=640.0, values_per_area=0.0,
                              frames_at_once=1, input_copies=1.0, mflop_per_pixel=4.7,
                              first_frame_mflop_per_pixel=4.7)
"""FLUX / SD3 (block_out_channels 128, 256, 512, 512): 5 x 128 values a pixel at the first stage, counted 640.0 at
512^2 and at 1024^2 (2.5 GiB in fp32 at 1024^2); 4.66 MFLOP a pixel at 1024^2 (4.26 at 512^2: the mid-block
attention grows with the tokens)."""
WAN_ENCODER = EncoderMemory(vae_class="AutoencoderKLWan", channels=96, values_per_pixel=854.0, values_per_area=117.0,
                            frames_at_once=4, input_copies=1.0, mflop_per_pixel=5.05, first_frame_mflop_per_pixel=6.7)
"""Wan 2.1 (base_dim 96): 971 values a pixel for one frame, 3,533 from nine frames on (the first frame, then
chunks of four beside a full cache), the same at 208x120 and 1280x720; 6.67 MFLOP a pixel for one frame, 5.03 to
5.11 a pixel and frame over 81 (208x120 to 1280x720)."""
QWEN_IMAGE_ENCODER = replace(WAN_ENCODER, vae_class="AutoencoderKLQwenImage")
"""Qwen-Image: Wan's encoder, encoding one frame (counted 968 values and 6.76 MFLOP a pixel at 512^2)."""

QWEN_IMAGE_21_ENCODER = EncoderMemory(vae_class="AutoencoderKLQwenImage21", channels=96, values_per_pixel=965.0,
                                      values_per_area=0.0, frames_at_once=1, input_copies=1.0, mflop_per_pixel=3.0,
                                      first_frame_mflop_per_pixel=3.0)
"""Qwen-Image 2.1 (base_dim 96, dim_mult 1-2-4-8-8, RGBA in): its condition image in one pass, no feature cache;
counted 968 values (its 4 input channels included) and 2.98 to 3.01 MFLOP a pixel at 512^2 and 1024^2 on the meta
device."""
FLUX2_ENCODER = replace(IMAGE_ENCODER, vae_class="AutoencoderKLFlux2")
"""FLUX.2 (`AutoencoderKLFlux2`: diffusers' Encoder at FLUX.1's widths, 128, 256, 512, 512, two resnets a stage; only
its output convolution is wider, 64 channels for 32 latent ones): the image VAE's encoder."""

HUNYUAN_VIDEO15_ENCODER = EncoderMemory(vae_class="AutoencoderKLHunyuanVideo15", channels=128, values_per_pixel=768.0,
                                        values_per_area=137.0, frames_at_once=None, input_copies=1.0,
                                        mflop_per_pixel=14.0, first_frame_mflop_per_pixel=17.2)
"""HunyuanVideo 1.5 (block_out_channels 128, 256, 512, 1024, 1024): every frame at once, counted on the meta device
at 905 values a pixel for one frame (its I2V image, 128^2 to 256^2) and 768 a pixel and frame for nine; 17.2 MFLOP
a pixel for one frame, 14.4 a pixel and frame over nine. Its mid-block mask over one frame's latent tokens
(3,600 at 720p) is negligible beside the activations."""

ENCODERS: dict[str, EncoderMemory] = {memory.vae_class: memory for memory in (
    IMAGE_ENCODER, WAN_ENCODER, QWEN_IMAGE_ENCODER, QWEN_IMAGE_21_ENCODER, FLUX2_ENCODER, HUNYUAN_VIDEO15_ENCODER)}
"""Every VAE class whose encoder the planner models, by class name."""


def encoder_memory(vae_class: str, *, is_video: bool) -> EncoderMemory:
    """The model of `vae_class`'s encoder; an unknown or unnamed class is taken for Wan's (video) or the image VAE's."""
    return ENCODERS.get(vae_class) or (WAN_ENCODER if is_video else IMAGE_ENCODER)


def encode_peak_bytes(memory: EncoderMemory, *, width: int, height: int, frames: int | None, ranks: int = 1,
                      bytes_per_value: int = 2, channels: int | None = None) -> float:
    """Peak bytes on one rank while encoding a `width` x `height` x `frames` input over `ranks` ranks
    (patch-parallel when more than one); `channels` describes an encoder configured otherwise than the one the
    constants were counted on."""
    frames = max(frames or 1, 1)
    area = height * width
    chunk = frames if memory.frames_at_once is None else min(frames, memory.frames_at_once)
    activations = memory.scale(channels) * area * (memory.values_per_pixel * chunk + memory.values_per_area)
    whole_input = 3 * frames * area
    ranks = max(ranks, 1)
    # each rank: its tile's activations and its tile of the input, beside the whole input it was handed
    tile_input = whole_input / ranks if ranks > 1 else 0.0
    values = activations / ranks + memory.input_copies * whole_input + tile_input
    return values * bytes_per_value


def encode_flops(memory: EncoderMemory, *, width: int, height: int, frames: int | None) -> float:
    """The encoder's FLOPs over the whole input (all ranks together)."""
    later = max(frames or 1, 1) - 1
    return width * height * (memory.first_frame_mflop_per_pixel + later * memory.mflop_per_pixel) * 1e6


__all__ = ["ENCODERS", "EncoderMemory", "encode_flops", "encode_peak_bytes", "encoder_memory"]
