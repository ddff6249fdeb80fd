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

from genbatch.models.vae_costs import EncoderMemory


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


__all__ = ["EncoderMemory", "encode_flops", "encode_peak_bytes"]
