"""Z-Image (`tiny-z-image`): a job's output equals `ZImagePipeline.__call__`'s own, on the Turbo path (guidance 0,
one branch: identical pixels) and on the CFG path (guidance above 0 with a negative prompt: the pipeline batches
the two branches, genbatch runs them apart, equal within fp32 rounding), at two sizes, from the preset and from a
saved directory; the CFG's normalisation and truncation as the pipeline applies them; the branches a row runs;
ulysses, ring, tp, --fsdp and cfg 2 equal one process; a batch of rows with captions of different lengths equals
the rows one by one; a random LoRA equals diffusers' load_lora_weights; the hub id resolves from the cache."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from genbatch.models import family, resolve_model
from genbatch.models.hooks import COND, UNCOND
from genbatch.models.z_image import ZImageGuidance, z_image_cfg
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import check_two_rank_layouts, genbatch_frames, pipeline_frames, saved_preset
from tests.support import executor as drive
from tests.support.runs import job, job_executor

PRESET = "tiny-z-image"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("z-image") / "model")


CASES = [  # (guidance, negative prompt, (width, height), from a directory)
    (0.0, None, (64, 64), False),  # Turbo: one branch
    pytest.param(4.0, "blurry, grey", (64, 64), False, marks=pytest.mark.slow),  # CFG against the negative prompt
    pytest.param(0.0, None, (80, 48), True, marks=pytest.mark.slow),
    (3.0, None, (48, 80), True),  # CFG against the empty prompt, the pipeline's negative when none is given
]


@pytest.mark.parametrize(("guidance", "negative", "size", "from_directory"), CASES,
                         ids=["turbo", "cfg", "turbo-directory-wide", "cfg-empty-negative-directory-tall"])
def test_output_equals_the_diffusers_pipeline(guidance, negative, size, from_directory, request, tmp_path):
    model = request.getfixturevalue("directory") if from_directory else PRESET
    spec_job = job(PRESET, model=model, seed=1234, num_inference_steps=3, guidance_scale=guidance,
                   negative_prompt=negative, width=size[0], height=size[1])
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    call = {"guidance_scale": guidance, **({"negative_prompt": negative} if negative else {})}
    theirs = pipeline_frames(model, spec_job, **call)
    assert ours.shape == theirs.shape == (size[1], size[0], 3)
    if guidance == 0:
        np.testing.assert_array_equal(ours, theirs)
    else:  # the pipeline's one forward of both branches (padded to the longer caption) against two
        assert np.abs(ours - theirs).max() <= 1e-5
    assert ours.std() > 0.01


def test_a_row_runs_two_branches_above_guidance_0_and_the_cfg_settings_are_the_models():
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    hooks = family("z-image").hooks
    branches = {scale: sorted(hooks.encode(pipe, job(PRESET, guidance_scale=scale), torch.device("cpu")).branches)
                for scale in (0.0, 0.5, 4.0)}
    assert branches == {0.0: [COND], 0.5: sorted([COND, UNCOND]), 4.0: sorted([COND, UNCOND])}
    guidance = hooks.encode(pipe, job(PRESET, guidance_scale=4.0), torch.device("cpu")).guidance_scale
    assert (float(guidance), guidance.normalization, guidance.truncation) == (4.0, 0.0, 1.0)  # the pipeline's


def _pipeline_noise(cond, uncond, scale, normalization, truncation, t):
    """ZImagePipeline.__call__'s combination of one step, with its own code's arithmetic (b rows of (c, 1, h, w))."""
    steps = torch.tensor([t])
    norms = ((1000 - steps.float()) / 1000).tolist() if float(truncation) <= 1 else None
    current = 0.0 if norms is not None and norms[0] > truncation else scale
    if current == 0:
        return -torch.stack([row.float() for row in cond], dim=0).squeeze(2)
    rows = []
    for pos, neg in zip(cond, uncond):
        pred = pos + current * (pos - neg)
        if normalization and float(normalization) > 0.0:
            ori, new = torch.linalg.vector_norm(pos), torch.linalg.vector_norm(pred)
            if new > ori * float(normalization):
                pred = pred * (ori * float(normalization) / new)
        rows.append(pred)
    return -torch.stack(rows, dim=0).squeeze(2)


@pytest.mark.parametrize(("normalization", "truncation", "t"), [(0.0, 1.0, 999.0), (1.0, 1.0, 500.0),
                                                                 (0.5, 0.6, 500.0), (1.0, 0.4, 500.0)])
def test_cfg_normalization_and_truncation_combine_as_the_pipeline(normalization, truncation, t):
    generator = torch.Generator().manual_seed(0)
    cond, uncond = (torch.randn(2, 4, 1, 3, 5, generator=generator) for _ in range(2))
    ours = z_image_cfg({COND: cond.squeeze(2), UNCOND: uncond.squeeze(2)},
                       ZImageGuidance(4.0, normalization, truncation), torch.tensor(t))
    torch.testing.assert_close(ours, _pipeline_noise(cond, uncond, 4.0, normalization, truncation, t), rtol=0, atol=0)


def test_the_guidance_survives_a_pickle():
    import pickle

    guidance = pickle.loads(pickle.dumps(ZImageGuidance(3.0, 1.5, 0.7)))
    assert (float(guidance), guidance.normalization, guidance.truncation) == (3.0, 1.5, 0.7)


def test_layouts_equal_one_process(tmp_path):
    # 15 image tokens (padded to 32 by the model) and a caption padded to 32: the image refiners split 32 tokens,
    # the main blocks 64, over 2 ranks; true CFG against a negative prompt of another length
    spec_job = job(PRESET, width=80, height=48, num_inference_steps=2, seed=17, guidance_scale=4.0,
                   negative_prompt="grey")
    # (dp, cfg, ring, ulysses, fsdp[, tp])
    check_two_rank_layouts(spec_job, [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 1, False, 2),
                                      (1, 1, 1, 2, True), (1, 2, 1, 1, False)], tmp_path, timeout_s=120)


def test_a_batch_equals_its_rows_one_by_one(tmp_path):
    # captions of different lengths: the transformer pads the batch's to the longest and masks the padding
    rows = [replace(job(PRESET, num_inference_steps=2, seed=30 + index, prompt=prompt, guidance_scale=guidance),
                    id=f"row{index}", row=index)
            for index, prompt in enumerate(("a red fox", "a lighthouse on a cliff at dusk, in heavy rain"))
            for guidance in (3.0,)]
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        batched = drive.generate_batch(executor, rows, JobTimer(world.ctx.device))
        alone = [drive.generate(executor, row, JobTimer(world.ctx.device)) for row in rows]
    for index, row in enumerate(rows):
        np.testing.assert_allclose(batched[index], alone[index], rtol=0, atol=1e-5, err_msg=row.id)
    assert np.abs(batched[0] - batched[1]).max() > 0.05  # the prompts reach the image


@pytest.mark.slow
def test_a_lora_equals_diffusers_load_lora_weights(tmp_path):
    from genbatch.jobs.lora import LoraRef
    from tests.support.lora import peft_lora

    path = peft_lora(PRESET, tmp_path / "lora", ("to_q", "to_v", "to_out.0", "w1", "w2"), seed=1)
    spec_job = job(PRESET, num_inference_steps=2, seed=4, guidance_scale=0.0, lora=(LoraRef(path, 0.8),))
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        ours = drive.generate(executor, spec_job, JobTimer(world.ctx.device))
        base = drive.generate(executor, replace(spec_job, lora=()), JobTimer(world.ctx.device))
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    pipe.load_lora_weights(path, adapter_name="row")
    pipe.set_adapters("row", 0.8)
    theirs = pipe(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width, guidance_scale=0.0,
                  num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(4), output_type="np").images[0]
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(ours - base).max() > 0.01  # the adapter moved it


def test_the_hub_id_resolves_from_the_hub_cache(directory, tmp_path, monkeypatch):
    from tests.support.hub import add_snapshot

    cache = str(tmp_path / "hub")
    snapshot = add_snapshot(cache, "Tongyi-MAI/Z-Image-Turbo", directory, "0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    try:
        spec = resolve_model("Tongyi-MAI/Z-Image-Turbo")
    finally:
        resolve_model.cache_clear()
    assert (spec.family, spec.path, spec.uses_cfg, spec.size_multiple) == ("z-image", snapshot, True, 16)
    assert spec.defaults["guidance_scale"] == 5.0 and spec.defaults["num_inference_steps"] == 50  # __call__'s


@pytest.mark.slow
def test_compile_equals_eager_and_taylorseer_runs(tmp_path):
    spec_job = job(PRESET, num_inference_steps=4, seed=5, guidance_scale=4.0, negative_prompt="grey")
    with job_executor(str(tmp_path / "eager"), model=PRESET) as (world, executor):
        eager = drive.denoise(executor, spec_job, JobTimer(world.ctx.device))
        with drive.hook_summaries() as summaries:
            cached = drive.denoise(executor, replace(spec_job, cache="taylorseer:2"), JobTimer(world.ctx.device))
        hooked = summaries[-1]["cache_hooked"]
    with job_executor(str(tmp_path / "compiled"), model=PRESET, compile=True, compile_backend="aot_eager") as (
            world, executor):
        compiled = drive.denoise(executor, spec_job, JobTimer(world.ctx.device))
    assert (compiled - eager).abs().max().item() <= 1e-4
    assert hooked > 0 and 0 < (cached - eager).abs().max().item() < eager.abs().max().item()


def test_the_planner_takes_no_pipefusion_stages_for_it():
    from genbatch.planner.shapes import resolve_shape

    for name in ("z-image-turbo", PRESET):
        shape = resolve_shape(name)
        assert shape.sequence_parallel and not shape.pipeline_stages, name
    assert not resolve_shape("z-image-turbo").uses_cfg and resolve_shape(PRESET).uses_cfg  # Turbo runs at 0
