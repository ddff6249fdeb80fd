"""HunyuanVideo image-to-video (`tiny-hunyuan-video-i2v`, latent_concat): a row's image gives the frames
`HunyuanVideoImageToVideoPipeline.__call__` gives (the first 4 decoded frames dropped), from the preset and from a
saved directory, for an image of the output's aspect ratio and of another; the image reaches both the LLaVA prompt
encode (its image tokens before the prompt's: 288 + 252) and the latents; a batch's rows join their image latents;
ulysses, ring, tp and --fsdp run it as one process does; a row without an image is rejected naming the column, and
a token_replace transformer is refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from genbatch.io.media_input import MediaReader
from genbatch.jobs.prepared import PreparedJob
from genbatch.models import family, resolve_model
from genbatch.models.hunyuan_video_i2v import TEXT_TOKENS, TINY_TRANSFORMER
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import (
    assert_a_row_without_an_image_is_rejected,
    check_two_rank_layouts,
    genbatch_frames,
    pipeline_frames,
    random_image,
    saved_preset,
)
from tests.support.runs import job, job_executor
from tests.support import executor as drive

PRESET = "tiny-hunyuan-video-i2v"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("hunyuan-i2v") / "model")


@pytest.mark.parametrize(("output", "source", "from_directory"), [((64, 48), (64, 48), False),
                                                                   ((48, 64), (72, 40), False),
                                                                   ((64, 48), (40, 56), True)],
                         ids=["same-aspect", "other-aspect", "directory-other-aspect"])
def test_output_equals_the_diffusers_pipeline(tmp_path, request, output, source, from_directory):
    model = request.getfixturevalue("directory") if from_directory else PRESET
    image = random_image(tmp_path / "in.png", source)
    # a negative prompt is ignored, as the pipeline ignores it with its default true_cfg_scale of 1
    spec_job = job(PRESET, model=model, seed=5, num_inference_steps=2, width=output[0], height=output[1],
                   image=image, negative_prompt="dull")
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(model, spec_job, image=Image.open(image), num_frames=spec_job.num_frames,
                             guidance_scale=spec_job.guidance_scale, negative_prompt="dull")
    assert ours.shape == theirs.shape == (spec_job.num_frames - 4, output[1], output[0], 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01


def test_the_image_reaches_the_prompt_encode_and_the_latents(tmp_path):
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    hooks = family("hunyuan-video-i2v").hooks
    runs = {}
    for colour in (0, 255):
        image = str(tmp_path / f"{colour}.png")
        Image.new("RGB", (64, 48), (colour,) * 3).save(image)
        spec_job = PreparedJob.of(job(PRESET, image=image), media={"image": MediaReader().read("image", image)})
        (branch,) = hooks.encode(pipe, spec_job, torch.device("cpu")).branches.values()
        trajectory = hooks.trajectory(pipe, spec_job, torch.Generator().manual_seed(0), torch.device("cpu"))
        runs[colour] = branch, trajectory
    (black, black_path), (white, white_path) = runs[0], runs[255]
    # the kept image tokens, then the prompt's: every image token valid, the padded prompt masked
    assert black["encoder_hidden_states"].shape[:2] == black["encoder_attention_mask"].shape == (1, TEXT_TOKENS)
    mask = black["encoder_attention_mask"][0]
    assert mask[:288].all() and 0 < int(mask[288:].sum()) < 252 and not mask[-1]
    image_tokens = (black["encoder_hidden_states"] - white["encoder_hidden_states"])[0].abs().amax(dim=-1)
    assert image_tokens[:288].min() > 0 and image_tokens[288:].max() > 0  # the prompt's tokens attend to the image
    # the image's latents as the first latent frame of their channels, zeros after it, and the mask beside them
    image_latents, first = black_path.shared["image_latents"], black_path.shared["mask"]
    assert image_latents.shape == (1, 4, 3, 6, 8) and first.shape == (1, 1, 3, 6, 8)
    assert not image_latents[:, :, 1:].any() and first[:, :, 0].all() and not first[:, :, 1:].any()
    assert (image_latents[:, :, 0] - white_path.shared["image_latents"][:, :, 0]).abs().max() > 0.1


def test_a_batch_joins_its_rows_image_latents(tmp_path):
    rows = [replace(job(PRESET, num_inference_steps=2, num_frames=5, seed=30 + index, prompt=prompt,
                        image=random_image(tmp_path / f"{index}.png", size)), id=f"row{index}", row=index)
            for index, (prompt, size) in enumerate((("a red fox", (64, 48)), ("a lighthouse at dusk", (40, 56))))]
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        batched = drive.generate_batch(executor, rows, JobTimer(world.ctx.device))
        alone = [drive.generate(executor, row, JobTimer(world.ctx.device)) for row in rows]
    for index, row in enumerate(rows):
        np.testing.assert_allclose(batched[index], alone[index], rtol=0, atol=2e-4, err_msg=row.id)
    assert np.abs(batched[0] - batched[1]).max() > 1e-2


def test_sequence_tp_and_fsdp_layouts_equal_one_process(tmp_path):
    # 45 video tokens (3 latent frames of 3 x 5) and 540 text tokens: uneven over 2 ranks
    spec_job = job(PRESET, width=80, height=48, num_inference_steps=3, seed=17,
                   image=random_image(tmp_path / "in.png", (72, 40)))
    check_two_rank_layouts(spec_job, [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 2, True),
                                      (1, 1, 1, 1, False, 2)], tmp_path)


def test_a_row_without_an_image_is_rejected_naming_the_column(tmp_path):
    spec = resolve_model(PRESET)
    assert (spec.family, spec.media_inputs, spec.media_required, spec.uses_cfg, spec.text_tokens) == (
        "hunyuan-video-i2v", ("image",), ("image",), False, TEXT_TOKENS)
    assert_a_row_without_an_image_is_rejected(PRESET, tmp_path, "a red fox")


def test_a_token_replace_transformer_is_refused():
    from genbatch.models.hunyuan_video import TINY_VAE
    from genbatch.models.hunyuan_video_i2v import read_spec

    token_replace = dict(TINY_TRANSFORMER, in_channels=4, image_condition_type="token_replace")
    with pytest.raises(ValueError, match="image_condition_type 'latent_concat'.*not 'token_replace'"):
        read_spec("hunyuanvideo-i2v", token_replace, TINY_VAE, None, "/models/hunyuanvideo-i2v")
