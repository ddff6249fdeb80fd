"""Qwen-Image-Edit image editing (`tiny-qwen-image-edit`): a row's image gives the image
`QwenImageEditPipeline.__call__` gives at the row's size, with true CFG and without, for an input of the
output's aspect ratio and of another, at the preset's input area and at the pipeline's own megapixel; the
input is resized as `calculate_dimensions` resizes it; a row without an image is rejected naming the column;
the input's tokens join the image stream, which ulysses, ring, cfg, tp and --fsdp run as one process does, and
PipeFusion's and DistriFusion's patches (a share of the noise's rows and of the input's each) run as they run
text rows: exact over their warm-up, at most half naive patches' error after it; `gen run` records the image's
URL and sha256."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from genbatch.models import resolve_model
from genbatch.models.qwen_image_edit import INPUT_AREA, input_size
from tests.models.pipeline_outputs import (
    assert_a_row_without_an_image_is_rejected,
    assert_stale_methods_run_it,
    assert_stale_methods_run_it_end_to_end,
    check_two_rank_layouts,
    genbatch_frames,
    pipeline_frames,
    random_image,
)
from tests.support.runs import job

PRESET = "tiny-qwen-image-edit"


@pytest.fixture
def preset_area(monkeypatch):
    """The pipeline resizing its input to the preset's `input_area`, where its own constant is a megapixel: the
    one line of `__call__` the preset changes (`calculate_dimensions(1024 * 1024, ratio)`)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as module

    area = resolve_model(PRESET).defaults["input_area"]
    own = module.calculate_dimensions
    monkeypatch.setattr(module, "calculate_dimensions", lambda target_area, ratio: own(area, ratio))
    return area


def _compare(tmp_path, output, source, negative, steps):
    image = random_image(tmp_path / "in.png", source)
    spec_job = job(PRESET, seed=5, num_inference_steps=steps, width=output[0], height=output[1], image=image,
                   negative_prompt=negative)
    ours = genbatch_frames(PRESET, spec_job, str(tmp_path / "out"))
    call = {"negative_prompt": negative} if negative is not None else {}
    theirs = pipeline_frames(PRESET, spec_job, image=Image.open(image), true_cfg_scale=spec_job.guidance_scale,
                             **call)
    assert ours.shape == theirs.shape == (output[1], output[0], 3)
    np.testing.assert_array_equal(ours, theirs)
    return ours


@pytest.mark.parametrize(("output", "source", "negative"), [((64, 48), (64, 48), "blurry"),
                                                            ((48, 64), (72, 40), None)],
                         ids=["same-aspect-true-cfg", "other-aspect-one-branch"])
def test_output_equals_the_diffusers_pipeline(tmp_path, preset_area, output, source, negative):
    _compare(tmp_path, output, source, negative, steps=2)


def test_output_equals_the_diffusers_pipeline_at_its_own_megapixel(tmp_path, monkeypatch):
    # the preset with the pipeline's own input area: 1376 x 768 pixels, 4128 tokens beside the output's 12
    monkeypatch.setitem(resolve_model(PRESET).defaults, "input_area", INPUT_AREA)
    _compare(tmp_path, (64, 48), (72, 40), None, steps=2)


def test_the_input_is_resized_to_the_area_at_its_aspect_ratio():
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    for size in ((1920, 1080), (512, 512), (1000, 3000), (72, 40), (333, 517)):
        assert input_size(size) == calculate_dimensions(INPUT_AREA, size[0] / size[1])[:2]
    assert input_size((1920, 1080)) == (1376, 768)  # 16:9, about a megapixel
    assert input_size((512, 512)) == (1024, 1024)  # upscaled
    assert input_size((72, 40), 64 * 64) == (96, 32)  # the preset's area
    with pytest.raises(ValueError, match="crop it to a less extreme aspect ratio"):
        input_size((4000, 10), 64 * 64)


def test_a_row_without_an_image_is_rejected_naming_the_column(tmp_path):
    spec = resolve_model(PRESET)
    assert (spec.family, spec.media_inputs, spec.media_required, spec.joins_image_tokens) == (
        "qwen-image-edit", ("image",), ("image",), True)
    assert_a_row_without_an_image_is_rejected(PRESET, tmp_path)


def test_sequence_cfg_fsdp_and_tp_layouts_equal_one_process(tmp_path):
    image = random_image(tmp_path / "in.png", (72, 40))
    # 12 noise tokens and 12 of the input's (96 x 32), 24 image tokens beside the text's: uneven over 2 ranks
    spec_job = job(PRESET, width=64, height=48, num_inference_steps=3, seed=17, image=image, negative_prompt="grey")
    # (dp, cfg, ring, ulysses, fsdp[, tp])
    check_two_rank_layouts(spec_job, [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 2, 1, 1, False),
                                      (1, 1, 1, 2, True), (1, 1, 1, 1, False, 2)], tmp_path)


def test_pipefusion_and_distrifusion_run_it_as_they_run_text_rows(tmp_path):
    # 3 rows of 4 noise tokens and 2 rows of 6 of the input's (96 x 32), both branches of true CFG on each rank
    image = random_image(tmp_path / "in.png", (72, 40))
    assert_stale_methods_run_it(job(PRESET, width=64, height=48, num_inference_steps=4, seed=17, image=image,
                                    negative_prompt="grey"), tmp_path)


def test_gen_run_runs_it_under_pipefusion_and_distrifusion(tmp_path):
    assert_stale_methods_run_it_end_to_end(PRESET, random_image(tmp_path / "in.png", (64, 64)), tmp_path)


def test_gen_run_records_the_image_and_its_sha256(tmp_path):
    from tests.support.runs import run_cli, write_manifest

    (tmp_path / "images").mkdir()
    image = random_image(tmp_path / "images" / "boat.png", (72, 40))
    rows = [{"id": "edit", "prompt": "the boat at night", "model": PRESET, "image": "images/boat.png",
             "negative_prompt": "blurry", "num_inference_steps": 2, "width": 48, "height": 32},
            {"id": "no-image", "prompt": "the boat at night", "model": PRESET, "num_inference_steps": 2}]
    out = tmp_path / "out"
    result = run_cli("run", write_manifest(str(tmp_path / "m.parquet"), rows), "--out", str(out), "-q")
    assert result.returncode == 1, result.stderr[-3000:]  # the rejected row is work not done
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert results["edit"]["status"] == "done" and results["edit"]["image"] == image
    assert results["edit"]["image_sha256"] == hashlib.sha256(open(image, "rb").read()).hexdigest()
    assert results["no-image"]["status"] == "rejected" and "starts from an image" in results["no-image"]["error"]
    assert Image.open(next((out / "outputs").glob("edit.*"))).size == (48, 32)
