"""FLUX.1 Kontext image editing (`tiny-flux-kontext`): a row's image gives the image
`FluxKontextPipeline.__call__` gives at the row's size, for an input of the output's aspect ratio and of
another; the input's tokens join the image stream, which sequence parallelism, tp and --fsdp split as one
process does, and PipeFusion's and DistriFusion's patches (a share of the noise's rows and of the input's each)
run as they run FLUX text rows: exact over their warm-up, at most half naive patches' error after it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from genbatch.models.flux_kontext import input_size
from tests.models.pipeline_outputs import (
    check_two_rank_layouts,
    assert_stale_methods_run_it,
    assert_stale_methods_run_it_end_to_end,
    genbatch_frames,
    pipeline_frames,
    random_image,
)
from tests.support.runs import job

PRESET = "tiny-flux-kontext"


@pytest.mark.parametrize(("output", "source"), [((64, 48), (64, 48)), ((48, 64), (72, 40))],
                         ids=["same-aspect", "other-aspect"])
def test_output_equals_the_diffusers_pipeline(tmp_path, output, source):
    image = random_image(tmp_path / "in.png", source)
    spec_job = job(PRESET, seed=5, num_inference_steps=2, width=output[0], height=output[1], image=image)
    ours = genbatch_frames(PRESET, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(PRESET, spec_job, image=Image.open(image), max_area=output[0] * output[1],
                             _auto_resize=False, guidance_scale=spec_job.guidance_scale)
    assert ours.shape == theirs.shape == (output[1], output[0], 3)
    np.testing.assert_array_equal(ours, theirs)


def test_a_row_without_an_image_is_flux_text_to_image(tmp_path):
    spec_job = job(PRESET, seed=2, num_inference_steps=2)
    np.testing.assert_array_equal(genbatch_frames(PRESET, spec_job, str(tmp_path / "out")),
                                  pipeline_frames(PRESET, spec_job, max_area=64 * 64, _auto_resize=False,
                                                  guidance_scale=spec_job.guidance_scale))


def test_the_input_is_resized_to_the_preferred_resolution_nearest_its_aspect():
    assert input_size((1920, 1080), 16, auto_resize=True) == (1392, 752)  # 16:9 -> the nearest, 1.85
    assert input_size((512, 512), 16, auto_resize=True) == (1024, 1024)  # upscaled to a megapixel
    assert input_size((1000, 3000), 16, auto_resize=True) == (672, 1568)
    assert input_size((72, 40), 16, auto_resize=False) == (64, 32)  # its own size, down to a multiple of 16


def test_sequence_fsdp_and_tp_layouts_equal_one_process(tmp_path):
    image = random_image(tmp_path / "in.png", (48, 48))
    # 12 noise tokens and 9 of the image's: 21, uneven over 2 ranks
    spec_job = job(PRESET, width=64, height=48, num_inference_steps=3, seed=17, image=image)
    check_two_rank_layouts(spec_job, [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 2, True),
                                      (1, 1, 1, 1, False, 2)], tmp_path, timeout_s=60)


def test_pipefusion_and_distrifusion_run_it_as_they_run_flux(tmp_path):
    # 3 rows of 4 noise tokens and 3 rows of 3 of the input's: each patch a share of both
    image = random_image(tmp_path / "in.png", (48, 48))
    assert_stale_methods_run_it(job(PRESET, width=64, height=48, num_inference_steps=4, seed=17, image=image),
                                tmp_path)


def test_gen_run_runs_it_under_pipefusion_and_distrifusion(tmp_path):
    assert_stale_methods_run_it_end_to_end(PRESET, random_image(tmp_path / "in.png", (64, 64)), tmp_path)
