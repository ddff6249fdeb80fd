"""HunyuanVideo: a job's output equals `HunyuanVideoPipeline`'s own (identical frames), from the preset and from
a saved directory; its text is padded to 256 tokens with a key-padding mask; it takes no cfg axis."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genbatch.models import family, resolve_model
from genbatch.parallel.dims import ParallelDims
from genbatch.runner.loading import load_pipeline
from tests.models.pipeline_outputs import genbatch_frames, pipeline_frames, saved_preset
from tests.support.runs import job

PRESET = "tiny-hunyuan-video"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("hunyuan") / "model")


@pytest.mark.parametrize("from_directory", [False, True], ids=["preset", "directory"])
def test_output_equals_the_diffusers_pipeline(from_directory, directory, tmp_path):
    model = directory if from_directory else PRESET
    # a negative prompt is ignored, as the pipeline ignores it with its default true_cfg_scale of 1
    spec_job = job(PRESET, model=model, seed=4321, negative_prompt="dull", guidance_scale=6.0)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(model, spec_job, num_frames=spec_job.num_frames, guidance_scale=spec_job.guidance_scale,
                             negative_prompt=spec_job.negative_prompt)
    assert ours.shape == theirs.shape == (9, 48, 64, 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01


def test_the_guidance_scale_is_an_input_of_the_transformer(tmp_path):
    first, second = (genbatch_frames(PRESET, job(PRESET, seed=5, num_inference_steps=2, guidance_scale=scale),
                                     str(tmp_path / str(scale))) for scale in (6.0, 2.0))
    assert not np.array_equal(first, second)


def test_the_text_is_padded_to_256_tokens_behind_a_key_padding_mask():
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    conditioning = family("hunyuan-video").hooks.encode(pipe, job(PRESET, prompt="a red fox"), torch.device("cpu"))
    (branch,) = conditioning.branches.values()  # one branch: no CFG
    mask = branch["encoder_attention_mask"]
    assert branch["encoder_hidden_states"].shape[:2] == mask.shape == (1, 256)
    # the prompt's tokens and the template's closing marker, then padding
    valid = int(mask.sum())
    assert 0 < valid < 256 and mask[0, :valid].all() and not mask[0, valid:].any()


def test_a_cfg_layout_is_refused():
    spec = resolve_model(PRESET)
    with pytest.raises(ValueError, match="cfg"):
        ParallelDims(cfg=2).validate(world_size=2, num_heads=spec.num_heads, uses_cfg=spec.uses_cfg)
