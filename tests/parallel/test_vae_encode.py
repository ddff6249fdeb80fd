"""Patch-parallel VAE encode on 2 and 4 gloo processes against a one-process `vae.encode`.

One pool call per world size runs every case: Wan 2.1's VAE and Wan 2.2's residual, 2x2-patched one, strips
of even and uneven height, a one-row latent (tiles side by side), one frame and five; the FLUX/SD3
AutoencoderKL (the tiny presets', and one with real 32-group GroupNorm); and the encode a pipeline's own
`prepare_latents` makes inside `parallel_encoding`. An image-to-video job under ulysses 2 encodes on tiles."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from tests.parallel.test_vae import WAN22_VAE, WIDE_IMAGE_VAE
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks

TOLERANCE = 1e-4
WORLD_SIZES = (2, 4)


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    name: str
    config: str
    """'tiny' (the presets' Wan 2.1 VAE), 'wan22', 'qwen-image' (its preset's), 'image-tiny' (the FLUX presets') or
    'image-wide'."""
    video: tuple[int, ...]
    """(b, c, f, h, w) pixels, (b, c, h, w) for an image VAE."""


CASES = [
    Case(name="wan-h6-five-frames", config="tiny", video=(1, 3, 5, 48, 64)),
    Case(name="wan-h7-uneven", config="tiny", video=(1, 3, 5, 56, 40)),
    Case(name="wan-one-frame", config="tiny", video=(1, 3, 1, 48, 64)),
    Case(name="wan-h1-side-by-side", config="tiny", video=(1, 3, 5, 8, 64)),
    Case(name="wan22-residual-patched-h5", config="wan22", video=(1, 3, 5, 80, 48)),
    Case(name="qwen-image-h7", config="qwen-image", video=(1, 3, 1, 56, 48)),  # an image: one frame
    Case(name="image-tiny-h7", config="image-tiny", video=(1, 3, 56, 48)),
    Case(name="image-tiny-h2-batch2", config="image-tiny", video=(2, 3, 16, 64)),
    Case(name="image-wide-h9", config="image-wide", video=(1, 3, 72, 40)),
]


def _vae(config: str):
    from diffusers import AutoencoderKL, AutoencoderKLWan

    from genbatch.models.tiny_configs import TINY_FLUX_VAE, TINY_WAN_VAE

    torch.manual_seed(0)
    if config == "qwen-image":
        from diffusers import AutoencoderKLQwenImage

        from genbatch.models.qwen_image import TINY_VAE

        return AutoencoderKLQwenImage(**TINY_VAE).eval()
    if config.startswith("image"):
        return AutoencoderKL(**(TINY_FLUX_VAE if config == "image-tiny" else WIDE_IMAGE_VAE)).eval()
    return AutoencoderKLWan(**(TINY_WAN_VAE if config == "tiny" else WAN22_VAE)).eval()


def _encode_cases(rank: int, world_size: int, cases: list[Case]) -> list[dict]:
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_encode, parallel_encoding, supports_parallel_encode

    results = []
    for case in cases:
        vae = _vae(case.config)
        video = torch.rand(case.video, generator=torch.Generator().manual_seed(1)) * 2 - 1
        with torch.no_grad():
            reference = vae.encode(video).latent_dist.parameters
        comm = Comm(dist.group.WORLD, CommLedger())
        ours = parallel_encode(vae, video, comm).parameters
        with parallel_encoding(vae, comm), torch.no_grad():
            mode = vae.encode(video).latent_dist.mode()  # what a pipeline's retrieve_latents(argmax) takes
        swapped = [name for name, module in vae.named_modules() if "forward" in module.__dict__]
        results.append(dict(supported=supports_parallel_encode(vae), shape_ok=ours.shape == reference.shape,
                            diff=(ours - reference).abs().max().item(),
                            mode_diff=(mode - reference.chunk(2, dim=1)[0]).abs().max().item(),
                            restored=not swapped and "encode" not in vae.__dict__, sent=comm.ledger.take()))
    return results


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda p: f"p{p}")
def outcomes(request) -> dict[str, list[dict]]:
    per_rank = run_on_ranks(_encode_cases, request.param, (CASES,), timeout_s=60)
    return {case.name: [per_rank[rank][index] for rank in range(request.param)] for index, case in enumerate(CASES)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_parallel_encode_equals_one_rank_encode_and_leaves_the_vae_as_it_was(outcomes, case):
    ranks = outcomes[case.name]
    assert all(r["supported"] and r["shape_ok"] and r["restored"] for r in ranks), ranks
    assert max(r["diff"] for r in ranks) <= TOLERANCE, [r["diff"] for r in ranks]
    assert max(r["mode_diff"] for r in ranks) <= TOLERANCE
    assert all(r["sent"].get("p2p", 0) > 0 and r["sent"].get("all_gather", 0) > 0 for r in ranks), ranks


def test_an_encoder_with_a_layer_it_does_not_know_is_not_tiled_and_says_why():
    from diffusers import AutoencoderKL

    from genbatch.models.tiny_configs import TINY_FLUX_VAE
    from genbatch.parallel.vae.encode import unsupported_encode_reason

    pooled = AutoencoderKL(**TINY_FLUX_VAE)
    pooled.encoder.down_blocks[0].downsamplers[0].use_conv = False  # an average-pooling downsample
    reason = unsupported_encode_reason(pooled)
    assert reason is not None and "encoder.down_blocks.0.downsamplers.0" in reason and "pooling" in reason, reason


def _image_job_on_rank(rank: int, world_size: int, image: str, out: str) -> tuple[int, torch.Tensor]:
    """(tile-parallel encodes the job made, its final latents) of a Wan I2V job under ulysses 2."""
    from unittest import mock

    import genbatch.parallel.vae.encode as encode
    from genbatch.runner.timing import JobTimer
    from tests.support.runs import job, job_executor

    spec = job("tiny-wan-i2v", num_inference_steps=2, num_frames=5, seed=3, image=image)
    with mock.patch.object(encode, "tile_parallel", wraps=encode.tile_parallel) as tiled:
        with job_executor(out, model="tiny-wan-i2v", ulysses=world_size) as (world, executor):
            latents = drive.denoise(executor, spec, JobTimer(world.ctx.device))
    return tiled.call_count, latents


def test_an_image_rows_encode_is_split_over_its_job_group(tmp_path):
    from PIL import Image

    from genbatch.runner.timing import JobTimer
    from tests.support.runs import job, job_executor

    image = str(tmp_path / "first.png")
    Image.new("RGB", (64, 48), (250, 120, 20)).save(image)
    with job_executor(str(tmp_path / "one"), model="tiny-wan-i2v") as (world, executor):
        reference = drive.denoise(executor, job("tiny-wan-i2v", num_inference_steps=2, num_frames=5, seed=3, image=image),
                                     JobTimer(world.ctx.device))
    for tiled, latents in run_on_ranks(_image_job_on_rank, 2, (image, str(tmp_path / "two")), timeout_s=60):
        assert tiled == 1  # the conditioning video, encoded once, on tiles
        assert (latents - reference).abs().max().item() <= 1e-5
