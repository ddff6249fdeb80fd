"""Patch-parallel VAE decode of each family's published VAE config (random weights) on 2 gloo ranks.

The tiny presets keep a VAE's layers but not its widths: 3 to 8 channels where the published decoders have 96
to 1024, one resnet where they have two or more, GroupNorm groups of one or two channels where they have 32
groups of many. Here every VAE class genbatch splits decodes at the published config, on a small latent (2 rows
a rank), and must equal one rank's decode within floating-point rounding (1e-4 on pixels in [-1, 1]) with its
8-bit frames at most one level apart. Slow: the published decoders are minutes of CPU to build and run.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.parallel.test_vae import LEVEL_SHARE, TOLERANCE
from tests.support.distributed import run_on_ranks

LATENTS = {
    "wan-2.1": (1, 16, 2, 4, 4),
    "qwen-image": (1, 16, 1, 4, 4),
    "qwen-image-2.1": (1, 64, 1, 4, 4),
    "flux.1": (1, 16, 4, 4),
    "flux.2": (1, 32, 4, 4),
    "hunyuan-video-1.5": (1, 32, 2, 4, 4),
    "ltx-2": (1, 128, 2, 4, 4),
}
"""The latent each published VAE decodes: 4 rows (2 a rank), 1 or 2 latent frames for the video VAEs. SD3's and
Z-Image's VAEs are FLUX.1's decoder (AutoencoderKL, the same widths and groups)."""


def _published(name: str) -> tuple[str, dict]:
    """(diffusers class name, published config) of a family's VAE."""
    from genbatch.models import flux, flux2, hunyuan_video15, ltx2, qwen_image, qwen_image_21, wan

    return {
        "wan-2.1": ("AutoencoderKLWan", wan.WAN21_VAE),
        "qwen-image": ("AutoencoderKLQwenImage", qwen_image.PUBLISHED_VAE),
        "qwen-image-2.1": ("AutoencoderKLQwenImage21", qwen_image_21.PUBLISHED_VAE),
        "flux.1": ("AutoencoderKL", flux.FLUX1_VAE),
        "flux.2": ("AutoencoderKLFlux2", flux2.PUBLISHED_VAE),
        "hunyuan-video-1.5": ("AutoencoderKLHunyuanVideo15", hunyuan_video15.PUBLISHED_VAE),
        "ltx-2": ("AutoencoderKLLTX2Video", ltx2.PUBLISHED_CONFIG["vae"]),
    }[name]


def decode_published(rank: int, world_size: int, name: str) -> dict | None:
    """One rank's decode and the 2-rank patch-parallel decode of the published VAE `name`, compared on rank 0."""
    import diffusers

    from genbatch.models.hooks import to_uint8
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_decode, unsupported_reason

    class_name, config = _published(name)
    # lists where the family's record has tuples, as a config.json loads them (Wan's decoder adds lists to them)
    config = {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()}
    torch.manual_seed(0)
    vae = getattr(diffusers, class_name)(**config).eval()
    reason = unsupported_reason(vae)
    if reason is not None:
        return dict(reason=reason)
    latents = torch.randn(LATENTS[name], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = vae.decode(latents).sample if rank == 0 else None
    image = parallel_decode(vae, latents, Comm(dist.group.WORLD, CommLedger()))
    if rank != 0:
        return None

    def pixels(x):  # the pipelines' postprocess: [-1, 1] -> [0, 1], then genbatch's rounding
        return torch.from_numpy(to_uint8((x / 2 + 0.5).clamp(0, 1).numpy())).int()

    apart = (pixels(image) - pixels(reference)).abs()
    return dict(reason=None, shape_ok=image.shape == reference.shape, diff=(image - reference).abs().max().item(),
                scale=reference.abs().max().item(), levels=int(apart.max()), values_apart=int((apart > 0).sum()),
                values=apart.numel())


HEAVY = ("hunyuan-video-1.5", "ltx-2")
"""The video decoders of 1024 channels: a minute each on a quiet 2-core machine, five or more beside other work."""


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.timeout(900)) if name in HEAVY else name
                                  for name in LATENTS])
def test_published_vae_decodes_patch_parallel_as_one_rank(name):
    result = run_on_ranks(decode_published, 2, (name,), timeout_s=840)[0]
    assert result["reason"] is None, result["reason"]
    assert result["shape_ok"], result
    # a decode that is not all zeros or clamped flat, so the comparison has something to compare
    assert result["scale"] > 0.01, result
    assert result["diff"] <= TOLERANCE, result
    assert result["levels"] <= 1 and result["values_apart"] <= LEVEL_SHARE * result["values"] + 2, result
