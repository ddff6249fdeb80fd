"""LTX-2 image-to-video (video with sound): a job's frames and waveform equal `LTX2ImageToVideoPipeline`'s own given
the same re-compressed image (genbatch re-compresses with ffmpeg where diffusers uses PyAV, which is not installed:
the pipeline then skips its own, `image_crf=0`), from the preset and from a saved directory; the image is
re-compressed at the pipeline's CRF and reaches the output; ulysses 2 (the per-token timesteps split with the
video) and cfg 2 equal one process, frames and sound alike; a row without an image is rejected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genbatch.models import resolve_model
from genbatch.models.ltx2_i2v import conditioning_image
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import assert_a_row_without_an_image_is_rejected, random_image, saved_preset
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

PRESET = "tiny-ltx2-i2v"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("ltx2-i2v") / "model")


def _read(spec_job):
    """`spec_job` with its image read, as its batch's preparation reads it."""
    from genbatch.io.media_input import MediaReader
    from genbatch.jobs.prepared import PreparedJob

    return PreparedJob.of(spec_job, media={"image": MediaReader().read("image", spec_job.image)})


def genbatch_outputs(model: str, spec_job, out: str, **layout):
    """(final latents, frames, waveform) of the image row `spec_job` through genbatch's executor (None off the
    leader)."""
    with job_executor(out, model=model, **layout) as (world, executor):
        timer = JobTimer(world.ctx.device)
        spec_job = drive.prepared(executor, [spec_job], timer)[0]
        latents = drive.denoise(executor, spec_job, timer)
        output = drive.decode_row(executor, spec_job, latents, timer)
        return latents, output.frames, None if output.sound is None else output.sound.samples


@pytest.mark.parametrize(("from_directory", "size", "image"), [
    pytest.param(False, (96, 64), (80, 48), marks=pytest.mark.slow),  # the other size; the directory's holds the path
    (True, (64, 96), (48, 80))], ids=["preset-96x64", "directory-64x96"])
def test_frames_and_waveform_equal_the_diffusers_pipeline(from_directory, size, image, directory, tmp_path):
    model = directory if from_directory else PRESET
    width, height = size
    spec_job = job(PRESET, model=model, seed=77, negative_prompt="dull", num_inference_steps=3, width=width,
                   height=height, image=random_image(tmp_path / "in.png", image))
    _, frames, sound = genbatch_outputs(model, spec_job, str(tmp_path / "out"))
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    read = _read(spec_job)
    output = pipe(image=conditioning_image(pipe, read), image_crf=0, prompt=spec_job.prompt,
                  negative_prompt=spec_job.negative_prompt, height=height, width=width,
                  num_frames=spec_job.num_frames, frame_rate=spec_job.fps,
                  num_inference_steps=spec_job.num_inference_steps, guidance_scale=spec_job.guidance_scale,
                  generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np")
    assert frames.shape == output.frames[0].shape == (9, height, width, 3)
    np.testing.assert_array_equal(frames, output.frames[0])
    np.testing.assert_array_equal(sound, output.audio[0].float().numpy())


@pytest.mark.slow  # the equality above re-compresses the image as the pipeline does in make test
def test_the_image_is_recompressed_at_the_pipelines_crf_and_reaches_the_output(tmp_path):
    from diffusers.pipelines.ltx2.utils import DEFAULT_IMAGE_CRF

    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    first, second = (job(PRESET, seed=5, num_inference_steps=2, image=random_image(tmp_path / f"{w}.png", (w, 64)))
                     for w in (96, 80))
    read = _read(first)
    original = np.asarray(read.media["image"].image.convert("RGB"), dtype=int)
    assert DEFAULT_IMAGE_CRF == 33  # Gemma 3's generation: the pipeline's `image_crf=None` resolves to it
    changed = np.abs(np.asarray(conditioning_image(pipe, read), dtype=int) - original)
    assert changed.shape == original.shape and 0 < changed.mean() < 60  # H.264 at CRF 33: near, not equal
    outputs = [genbatch_outputs(PRESET, spec_job, str(tmp_path / f"run{index}"))
               for index, spec_job in enumerate((first, second))]
    assert not np.array_equal(outputs[0][1], outputs[1][1])


def test_ulysses_and_cfg_layouts_equal_one_process_frames_and_sound(tmp_path):
    from tests.parallel.test_layouts import _check

    # 27 video tokens (3 latent frames of 3 x 3): uneven over two ranks, the first frame's 9 at timestep 0
    spec_job = job(PRESET, seed=21, negative_prompt="dull", num_inference_steps=2, width=96, height=96,
                   num_frames=17, image=random_image(tmp_path / "in.png", (64, 64)))
    layouts = [(1, 1, 1, 2, False), (1, 2, 1, 1, False)]
    per_rank = run_on_ranks(_layouts, 2, args=(spec_job, layouts, str(tmp_path / "ranks")), timeout_s=120)
    reference = genbatch_outputs(PRESET, spec_job, str(tmp_path / "one"))
    _check([(spec_job, *layout) for layout in layouts],
           [[(latents, frames) for latents, frames, _ in outputs] for outputs in per_rank], {PRESET: reference[:2]})
    for index, layout in enumerate(layouts):
        sounds = [outputs[index][2] for outputs in per_rank if outputs[index][2] is not None]
        assert sounds and all(np.abs(sound - reference[2]).max() <= 1e-4 for sound in sounds), layout


def _layouts(rank, world_size, spec_job, layouts, out):
    return [genbatch_outputs(PRESET, spec_job, f"{out}/{index}/rank{rank}", dp=dp, cfg=cfg, ring=ring, ulysses=ulysses,
                             fsdp=fsdp) for index, (dp, cfg, ring, ulysses, fsdp) in enumerate(layouts)]


def test_a_row_without_an_image_is_rejected_naming_the_column(tmp_path):
    assert_a_row_without_an_image_is_rejected(PRESET, tmp_path)
