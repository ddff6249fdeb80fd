"""A genbatch job's output equals the diffusers pipeline's own output for the same model, prompt, seed and
settings: identical pixels for images, identical frames before video encoding. Checked for both presets,
built in memory and loaded back from a directory written with save_pretrained (the real loading code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor


@pytest.fixture(scope="module")
def saved_presets(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for name in ("tiny-wan", "tiny-flux", "tiny-sd3"):
        pipe = load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32)
        pipe.save_pretrained(root / name)
        paths[name] = str(root / name)
    return paths


def _genbatch_frames(model: str, spec_job, tmp_path) -> np.ndarray:
    with job_executor(str(tmp_path / "out"), model=model) as (world, executor):
        return drive.generate(executor, spec_job, JobTimer(world.ctx.device))


def _diffusers_frames(model: str, spec_job) -> np.ndarray:
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    kwargs = dict(
        prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width,
        num_inference_steps=spec_job.num_inference_steps, guidance_scale=spec_job.guidance_scale,
        generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np",
    )
    if spec_job.num_frames is not None:
        kwargs.update(num_frames=spec_job.num_frames, negative_prompt=spec_job.negative_prompt)
        return pipe(**kwargs).frames[0]
    if spec_job.negative_prompt is not None:
        kwargs["negative_prompt"] = spec_job.negative_prompt
    return pipe(**kwargs).images[0]


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux"])
@pytest.mark.parametrize("from_directory", [False, True], ids=["preset", "directory"])
def test_output_equals_the_diffusers_pipeline(preset, from_directory, saved_presets, tmp_path):
    model = saved_presets[preset] if from_directory else preset
    negative = "blurry, low quality" if preset == "tiny-wan" else None
    spec_job = job(preset, model=model, seed=1234, negative_prompt=negative)
    ours = _genbatch_frames(model, spec_job, tmp_path)
    theirs = _diffusers_frames(model, spec_job)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01  # a real image, not a constant


@pytest.mark.parametrize("from_directory", [False, True], ids=["preset", "directory"])
def test_sd3_equals_the_diffusers_pipeline_within_rounding(from_directory, saved_presets, tmp_path):
    """SD3's pipeline batches the two guidance branches; genbatch runs them apart (for CFG parallel)."""
    model = saved_presets["tiny-sd3"] if from_directory else "tiny-sd3"
    spec_job = job("tiny-sd3", model=model, seed=77, negative_prompt="grey")
    ours = _genbatch_frames(model, spec_job, tmp_path)
    theirs = _diffusers_frames(model, spec_job)
    assert np.abs(ours - theirs).max() <= 1e-5
    assert ours.std() > 0.01


def test_seed_changes_the_output(tmp_path):
    first = _genbatch_frames("tiny-flux", job("tiny-flux", seed=1), tmp_path)
    second = _genbatch_frames("tiny-flux", job("tiny-flux", seed=2), tmp_path)
    assert not np.array_equal(first, second)


@pytest.fixture(scope="module")
def wan22_directory(tmp_path_factory):
    """A Wan 2.2-style pipeline: two transformers switched at a boundary timestep, saved to a directory."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from genbatch.models import tiny_configs

    base = load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32)
    torch.manual_seed(5)
    low_noise = WanTransformer3DModel(**tiny_configs.TINY_WAN_TRANSFORMER).eval()
    pipe = WanPipeline(
        tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae, scheduler=base.scheduler,
        transformer=base.transformer, transformer_2=low_noise, boundary_ratio=0.6,
    )
    path = tmp_path_factory.mktemp("wan22") / "model"
    pipe.save_pretrained(path)
    return str(path)


def test_wan_2_2_two_experts_equal_the_diffusers_pipeline(wan22_directory, tmp_path):
    spec_job = job("tiny-wan", model=wan22_directory, seed=99, num_inference_steps=6, negative_prompt="dull")
    ours = _genbatch_frames(wan22_directory, spec_job, tmp_path)
    np.testing.assert_array_equal(ours, _diffusers_frames(wan22_directory, spec_job))
