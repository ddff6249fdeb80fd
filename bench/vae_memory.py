"""The planner's memory model against the peaks diffusers' own code reaches: VAE decodes, VAE encodes and
denoise activations.

    python bench/vae_memory.py                  # every case (about 15 minutes on one core, 8 of them the
                                                # 480p Wan decode)
    python bench/vae_memory.py --quick          # without the largest CPU decodes and encodes (about 5)
    python bench/vae_memory.py --encode --quick # the encodes alone, without the largest CPU ones (about 1)

Each case builds the real-size module (random weights), runs it once under genbatch's live-tensor count
(`genbatch.parallel.vae.peak_memory`: the bytes of every storage an operator makes, until it is freed) and
prints the counted peak beside the planner's (`genbatch.planner.vae_memory` for decodes, `ACTIVATION_TENSORS`
for the denoise), with the relative error and whether it is within 25%.

- `cpu` cases compute: Wan 2.1's VAE at 480x832 x 9 frames and at 240x416 x 5, the FLUX/SD3 image VAE at 1024^2
  and 512^2 (fp32, the dtype they run in on a CPU), and a real-width Wan 2.1-14B block stack (d 5,120, ffn
  13,824) in bf16, whose norms keep fp32 temporaries as on a GPU.
- `meta` cases count the same code on the meta device, shapes only, in seconds: the tiled modes and the
  published large decodes (HunyuanVideo 720p x 129 frames, CogVideoX 1.5 1360x768 x 161). One decode is
  counted both ways first, to show the two counts agree.
- Encodes (`genbatch.planner.vae_encode`) build their input inside the count as the pipelines do (Wan I2V's
  conditioning video: the first frame and zeros to the output's frames; an edit model's input image) and count
  the encoder's FLOPs under torch's `FlopCounterMode` beside the planner's MFLOP per pixel: Wan 2.1's VAE at
  720p x 81 frames (the I2V job of issue 27), 480p x 81 and 208x120 x 1..81, the image VAE at 1024^2 and 512^2,
  Qwen-Image's at 512^2 and 1024^2. On the meta device attention is its math form, so a single large frame
  counts the mid-block's attention scores, which the fused kernels of a GPU or a CPU never hold (the 720p
  one-frame and 1024^2 Qwen-Image cases show it; the CPU case beside them does not).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WITHIN = 0.25
"""The agreement the planner's model is held to."""
WAN_BLOCK = dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, in_channels=16, out_channels=16,
                 text_dim=4096, freq_dim=256)
"""Wan 2.1-14B's transformer width (its transformer/config.json)."""
IMAGE_VAE = dict(block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
                 up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2, latent_channels=16, sample_size=1024)
"""FLUX.1's vae/config.json (SD3's has the same decoder)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Decode:
    """One decode to count."""

    vae: str
    """The diffusers class (built with its defaults, the published config, unless it is the image VAE)."""
    mode: str
    """`full` or `tiled` (the VAE's own tiling)."""
    width: int
    height: int
    frames: int | None
    device: str
    """`cpu` (computes) or `meta` (shapes only)."""
    heavy: bool = False
    """Left out by --quick."""


DECODES = (
    Decode(vae="AutoencoderKLWan", mode="full", width=208, height=120, frames=5, device="meta"),
    Decode(vae="AutoencoderKLWan", mode="full", width=208, height=120, frames=5, device="cpu"),
    Decode(vae="AutoencoderKLWan", mode="full", width=832, height=480, frames=9, device="cpu", heavy=True),
    Decode(vae="AutoencoderKLWan", mode="full", width=416, height=240, frames=5, device="cpu"),
    Decode(vae="AutoencoderKL", mode="full", width=1024, height=1024, frames=None, device="cpu", heavy=True),
    Decode(vae="AutoencoderKL", mode="full", width=512, height=512, frames=None, device="cpu"),
    Decode(vae="AutoencoderKLWan", mode="tiled", width=832, height=480, frames=9, device="meta"),
    Decode(vae="AutoencoderKLWan", mode="full", width=1280, height=720, frames=81, device="meta"),
    Decode(vae="AutoencoderKLWan", mode="tiled", width=1280, height=720, frames=81, device="meta"),
    Decode(vae="AutoencoderKL", mode="tiled", width=2048, height=2048, frames=None, device="meta"),
    Decode(vae="AutoencoderKLQwenImage", mode="full", width=1024, height=1024, frames=None, device="meta"),
    Decode(vae="AutoencoderKLHunyuanVideo", mode="full", width=1280, height=720, frames=129, device="meta"),
    Decode(vae="AutoencoderKLHunyuanVideo", mode="tiled", width=1280, height=720, frames=129, device="meta"),
    Decode(vae="AutoencoderKLHunyuanVideo", mode="full", width=832, height=480, frames=13, device="meta"),
    Decode(vae="AutoencoderKLCogVideoX", mode="full", width=720, height=480, frames=49, device="meta"),
    Decode(vae="AutoencoderKLCogVideoX", mode="tiled", width=1360, height=768, frames=161, device="meta"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Encode:
    """One encode to count, its input built as the pipeline builds it."""

    vae: str
    """The diffusers class (the published config; the image VAE's is FLUX's)."""
    width: int
    height: int
    frames: int | None
    """Frames of the conditioning video (Wan I2V); None: one image."""
    device: str
    """`cpu` (computes) or `meta` (shapes only)."""
    heavy: bool = False
    """Left out by --quick."""


ENCODES = (
    Encode(vae="AutoencoderKLWan", width=208, height=120, frames=9, device="meta"),
    Encode(vae="AutoencoderKLWan", width=208, height=120, frames=9, device="cpu"),
    Encode(vae="AutoencoderKLWan", width=208, height=120, frames=1, device="meta"),
    Encode(vae="AutoencoderKLWan", width=208, height=120, frames=5, device="meta"),
    Encode(vae="AutoencoderKLWan", width=208, height=120, frames=81, device="meta"),
    Encode(vae="AutoencoderKLWan", width=832, height=480, frames=81, device="meta"),
    Encode(vae="AutoencoderKLWan", width=1280, height=720, frames=81, device="meta"),
    Encode(vae="AutoencoderKLWan", width=1280, height=720, frames=1, device="meta"),
    Encode(vae="AutoencoderKL", width=512, height=512, frames=None, device="cpu"),
    Encode(vae="AutoencoderKL", width=1024, height=1024, frames=None, device="meta"),
    Encode(vae="AutoencoderKL", width=1024, height=1024, frames=None, device="cpu", heavy=True),
    Encode(vae="AutoencoderKLQwenImage", width=512, height=512, frames=None, device="meta"),
    Encode(vae="AutoencoderKLQwenImage", width=512, height=512, frames=None, device="cpu", heavy=True),
    Encode(vae="AutoencoderKLQwenImage", width=1024, height=1024, frames=None, device="meta"),
)


def _build_vae(name: str, device: str):
    import diffusers

    torch.manual_seed(0)
    with torch.device(device):
        cls = getattr(diffusers, name)
        return (cls(**IMAGE_VAE) if name == "AutoencoderKL" else cls()).eval()


def _encode_input(case: Encode, first: torch.Tensor) -> torch.Tensor:
    """The tensor the pipeline hands the encoder, made from the first frame (or the image) `first`."""
    if case.vae == "AutoencoderKL":
        return first.clone()  # the preprocessed image, (1, 3, h, w)
    frames = case.frames or 1
    if frames == 1:
        return first.clone()
    # WanImageToVideoPipeline.prepare_latents: the first frame, then zeros to num_frames
    return torch.cat([first, first.new_zeros(1, 3, frames - 1, case.height, case.width)], dim=2)


def count_encode(case: Encode) -> tuple[int, float, float]:
    """(counted peak bytes, FLOPs, seconds) of one encode, its input built inside the count."""
    from torch.utils.flop_counter import FlopCounterMode

    from genbatch.parallel.vae import peak_memory

    vae = _build_vae(case.vae, case.device)
    shape = (1, 3, case.height, case.width) if case.vae == "AutoencoderKL" else (1, 3, 1, case.height, case.width)
    first = torch.randn(shape, device=case.device)
    start = time.perf_counter()
    with torch.no_grad(), peak_memory(case.device) as peak:
        vae.encode(_encode_input(case, first))
    seconds = time.perf_counter() - start
    flops = 0.0
    if case.device == "meta":  # the FLOPs of the same shapes, counted without computing
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            vae.encode(_encode_input(case, first))
        flops = float(counter.get_total_flops())
    return peak.bytes, flops, seconds


def model_encode(case: Encode) -> tuple[float, float]:
    """(the planner's peak bytes in fp32, its MFLOP per input pixel and frame) for one rank's encode."""
    from genbatch.models.registry import vae_costs_of_class
    from genbatch.planner.vae_encode import encode_peak_bytes

    memory = vae_costs_of_class(case.vae, is_video=case.frames is not None).encoder
    peak = encode_peak_bytes(memory, width=case.width, height=case.height, frames=case.frames, bytes_per_value=4)
    frames = case.frames or 1
    mflop = (memory.first_frame_mflop_per_pixel + (frames - 1) * memory.mflop_per_pixel) / frames
    return peak, mflop


def _latent(case: Decode, vae) -> tuple[int, ...]:
    spatial = 8
    if case.frames is None and case.vae != "AutoencoderKLQwenImage":
        return (1, 16, case.height // spatial, case.width // spatial)
    frames = ((case.frames or 1) - 1) // 4 + 1
    return (1, 16, frames, case.height // spatial, case.width // spatial)


def count_decode(case: Decode) -> tuple[int, float]:
    """(counted peak bytes, seconds) of one decode."""
    import diffusers

    from genbatch.parallel.vae import peak_memory

    torch.manual_seed(0)
    with torch.device(case.device):
        cls = getattr(diffusers, case.vae)
        vae = (cls(**IMAGE_VAE) if case.vae == "AutoencoderKL" else cls()).eval()
        latents = torch.randn(_latent(case, vae))
    if case.mode == "tiled":
        vae.enable_tiling()
    start = time.perf_counter()
    with torch.no_grad(), peak_memory(case.device) as peak:
        vae.decode(latents)
    return peak.bytes, time.perf_counter() - start


def model_decode(case: Decode) -> float:
    from genbatch.models.registry import vae_costs_of_class
    from genbatch.planner.vae_memory import decode_peak_bytes

    memory = vae_costs_of_class(case.vae, is_video=case.frames is not None).decoder
    return decode_peak_bytes(memory, case.mode, width=case.width, height=case.height, frames=case.frames,
                             bytes_per_value=4)


def count_denoise(layers: int, latent: tuple[int, int, int]) -> tuple[int, int, float]:
    """(counted peak bytes, tokens, seconds) of one forward of a real-width Wan block stack in bf16 on the CPU."""
    from diffusers import WanTransformer3DModel

    from genbatch.parallel.vae import peak_memory

    torch.manual_seed(0)
    model = WanTransformer3DModel(num_layers=layers, **WAN_BLOCK).eval().to(torch.bfloat16)
    frames, height, width = latent
    x = torch.randn(1, 16, frames, height, width, dtype=torch.bfloat16)
    text = torch.randn(1, 512, 4096, dtype=torch.bfloat16)
    start = time.perf_counter()
    with torch.no_grad(), peak_memory("cpu") as peak:
        model(x, torch.tensor([500.0]), text, return_dict=False)
    return peak.bytes, frames * height * width // 4, time.perf_counter() - start


def _line(name: str, counted: float, modelled: float, seconds: float) -> tuple[str, bool]:
    error = modelled / counted - 1
    ok = abs(error) <= WITHIN
    return (f"{name}: counted {counted / 2**20:9.1f} MiB, planner {modelled / 2**20:9.1f} MiB, "
            f"error {error:+6.1%} {'within' if ok else 'OUTSIDE'} {WITHIN:.0%} ({seconds:.1f} s)"), ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="leave out the largest CPU decodes and encodes")
    parser.add_argument("--encode", action="store_true", help="the encodes alone")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the CPU cases")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    import warnings

    from diffusers.utils import logging as diffusers_logging

    warnings.filterwarnings("ignore")
    diffusers_logging.set_verbosity_error()  # the bf16 block stack's "keep in float32" advice: meant, as on GPUs
    from genbatch.planner.memory import ACTIVATION_TENSORS
    from genbatch.planner.workload import BYTES_PER_VALUE

    verdicts = []
    print("VAE encode peaks (fp32, input built inside the count; frames None: an image)")
    for case in ENCODES:
        if opts.quick and case.heavy:
            continue
        counted, flops, seconds = count_encode(case)
        modelled, mflop = model_encode(case)
        line, ok = _line(f"  {case.vae} encode {case.width}x{case.height}x{case.frames} {case.device}",
                         counted, modelled, seconds)
        if flops:
            pixels = case.width * case.height * (case.frames or 1)
            line += f"; {flops / pixels / 1e6:.2f} MFLOP a pixel (planner {mflop:.2f})"
        print(line, flush=True)
        verdicts.append(ok)
    if opts.encode:
        print(f"{sum(verdicts)} of {len(verdicts)} within {WITHIN:.0%}")
        return
    print("VAE decode peaks (fp32; frames None: an image)")
    for case in DECODES:
        if opts.quick and case.heavy:
            continue
        counted, seconds = count_decode(case)
        line, ok = _line(f"  {case.vae} {case.mode} {case.width}x{case.height}x{case.frames} {case.device}",
                         counted, model_decode(case), seconds)
        print(line, flush=True)
        verdicts.append(ok)
    print(f"denoise activations of one forward (bf16, planner: {ACTIVATION_TENSORS} [N, d] tensors)")
    for layers, latent in ((1, (4, 32, 32)), (2, (4, 64, 64))):
        counted, tokens, seconds = count_denoise(layers, latent)
        modelled = ACTIVATION_TENSORS * tokens * WAN_BLOCK["num_attention_heads"] * WAN_BLOCK["attention_head_dim"]
        line, ok = _line(f"  Wan 2.1-14B width, {layers} blocks, N = {tokens}", counted, modelled * BYTES_PER_VALUE,
                         seconds)
        print(line, flush=True)
        verdicts.append(ok)
    print(f"{sum(verdicts)} of {len(verdicts)} within {WITHIN:.0%}")


if __name__ == "__main__":
    main()
