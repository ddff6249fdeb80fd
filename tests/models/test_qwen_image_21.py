"""Qwen-Image 2.1 (`tiny-qwen-image-21`): a job's output equals `QwenImage21Pipeline.__call__`'s own (identical
pixels, its key/value cache included) without guidance, with true CFG, and with a condition image from the row's
`image` (of the output's aspect ratio and of another), at two sizes, from the preset and from a saved directory;
the prompt, the image and the guidance reach the output; a job resumed past its first step fills the cache again
and equals the uninterrupted one; ulysses 2, ring 2, tp, --fsdp and cfg 2 equal one process, and the stale-K/V
methods are refused naming the layouts that run it; a batch equals its rows one by one; the new VAE decodes (and encodes) patch-parallel at 2 and
4 ranks exactly as on one; a random LoRA equals diffusers' load_lora_weights; a sample_sigmas grid sets the steps;
the hub id resolves from the cache."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image

from genbatch.io.media_input import MediaReader
from genbatch.jobs.prepared import PreparedJob
from genbatch.models import family, resolve_model
from genbatch.models.hooks import COND, UNCOND
from genbatch.models.qwen_image_21 import TINY_VAE
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import (
    check_two_rank_layouts,
    genbatch_frames,
    pipeline_frames,
    random_image,
    saved_preset,
)
from tests.support.distributed import run_on_ranks
from tests.support import executor as drive
from tests.support.runs import job, job_executor

PRESET = "tiny-qwen-image-21"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("qwen21") / "model")


CASES = [  # (guidance, negative prompt, (width, height), condition image size or None, from a directory)
    (1.0, None, (64, 64), None, False),  # the pipeline's default: no guidance
    pytest.param(4.0, "blurry, grey", (96, 64), None, False, marks=pytest.mark.slow),  # true CFG, another aspect
    (1.0, None, (64, 96), (72, 40), False),  # a condition image of another aspect ratio than the output's
    (4.0, "grey", (64, 96), None, True),  # (a directory's condition image is resized to the pipeline's 1024^2:
]                                         # beyond the tiny vision tower's 64^2, so its image rows run from the preset)


@pytest.mark.parametrize(("guidance", "negative", "size", "source", "from_directory"), CASES,
                         ids=["text", "true-cfg-wide", "image-other-aspect", "true-cfg-tall-directory"])
def test_output_equals_the_diffusers_pipeline(guidance, negative, size, source, from_directory, request, tmp_path):
    model = request.getfixturevalue("directory") if from_directory else PRESET
    image = None if source is None else random_image(tmp_path / "in.png", source)
    spec_job = job(PRESET, model=model, seed=1234, num_inference_steps=3, guidance_scale=guidance,
                   negative_prompt=negative, width=size[0], height=size[1], image=image)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    call = {"true_cfg_scale": guidance, "output_resolution": 64, **({"negative_prompt": negative} if negative else {}),
            **({"image": Image.open(image)} if image else {})}
    theirs = pipeline_frames(model, spec_job, **call)
    assert theirs.shape == (size[1], size[0], 4)  # RGBA: genbatch keeps the RGB channels
    np.testing.assert_array_equal(ours, theirs[..., :3])
    assert ours.std() > 0.01


def _encoded(pipe, spec_job):
    media = {"image": MediaReader().read("image", spec_job.image)} if spec_job.image else {}
    return family("qwen-image-21").hooks.encode(pipe, PreparedJob.of(spec_job, media=media), torch.device("cpu"))


@pytest.mark.slow
def test_the_prompt_the_image_and_the_guidance_reach_the_output(tmp_path):
    image = random_image(tmp_path / "in.png", (64, 64))
    base = job(PRESET, num_inference_steps=2, seed=3)
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        runs = {name: drive.generate(executor, spec_job, JobTimer(world.ctx.device)) for name, spec_job in (
            ("base", base), ("prompt", replace(base, prompt="a lighthouse at dusk")),
            ("image", replace(base, image=image)),
            ("cfg", replace(base, guidance_scale=4.0, negative_prompt="grey")))}
    for name in ("prompt", "image", "cfg"):
        assert np.abs(runs[name] - runs["base"]).max() > 0.05, name
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    branches = {(negative, scale): sorted(_encoded(pipe, job(PRESET, negative_prompt=negative,
                                                             guidance_scale=scale)).branches)
                for negative in (None, "grey") for scale in (1.0, 4.0)}
    assert branches == {(None, 1.0): [COND], (None, 4.0): [COND], ("grey", 1.0): [COND],
                        ("grey", 4.0): sorted([COND, UNCOND])}
    # the image's vision tokens sit in the prompt's sequence, marked for the transformer
    (branch,) = _encoded(pipe, job(PRESET, image=image)).branches.values()
    assert branch["img_mask"].sum() > 0 and branch["img_mask"].shape == branch["encoder_hidden_states"].shape[:2]


def test_a_job_resumed_past_its_first_step_fills_the_cache_and_equals_the_uninterrupted_one(tmp_path):
    spec_job = PreparedJob.of(job(PRESET, num_inference_steps=4, seed=9, guidance_scale=4.0, negative_prompt="grey"))
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    hooks = family("qwen-image-21").hooks
    conditioning = hooks.encode(pipe, spec_job, torch.device("cpu"))

    def run(stop_after: int | None):
        trajectory = hooks.trajectory(pipe, spec_job, torch.Generator().manual_seed(9), torch.device("cpu"))
        latents = trajectory.latents
        for index, t in enumerate(trajectory.timesteps):
            if stop_after is not None and index == stop_after:  # a new process: its caches empty
                trajectory.shared["kv_caches"].clear()
            predictions = {name: hooks.predict(pipe, trajectory, latents, t, index, branch)
                           for name, branch in conditioning.branches.items()}
            latents = pipe.scheduler.step(hooks.combine(predictions, conditioning.guidance_scale, t), t, latents,
                                          return_dict=False)[0]
        return latents

    torch.testing.assert_close(run(2), run(None), rtol=0, atol=0)


def test_ulysses_ring_tp_fsdp_and_cfg_layouts_equal_one_process(tmp_path):
    # ulysses and ring split the output's tokens and keep the prefix (the prompt's, the image's) whole on each rank
    # (dp, cfg, ring, ulysses, fsdp[, tp])
    check_two_rank_layouts(_layouts_job(tmp_path), [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 1, False, 2),
                                                    (1, 2, 1, 1, True), (1, 2, 1, 1, False)], tmp_path, timeout_s=150)


def _layouts_job(tmp_path):
    """A condition image, true CFG, 3 steps (the first fills the cache, the later ones read it), and 3 x 3 output
    tokens after the prompt's and the image's: uneven over 2 and 4 ranks."""
    image = random_image(tmp_path / "in.png", (48, 40))
    return job(PRESET, width=96, height=96, num_inference_steps=3, seed=17, guidance_scale=4.0,
               negative_prompt="grey", image=image)


@pytest.mark.slow  # test_ulysses_ring_tp_fsdp_and_cfg_layouts_equal_one_process holds ulysses and ring in make test
def test_usp_ring_4_and_cfg_with_ulysses_equal_one_process_on_four_ranks(tmp_path):
    from tests.parallel.test_layouts import _all_layouts, _check, _run_job

    spec_job = _layouts_job(tmp_path)
    cases = [(spec_job, 1, 1, 2, 2, False), (spec_job, 1, 1, 4, 1, False), (spec_job, 1, 2, 1, 2, False)]
    per_rank = run_on_ranks(_all_layouts, 4, args=(cases, str(tmp_path / "ranks")), timeout_s=150)
    _check(cases, per_rank, {PRESET: _run_job(spec_job, None, 1, 1, 1, False, out=str(tmp_path / "one"))})


def test_stale_patch_attention_is_refused_naming_the_layouts_that_run_it():
    from genbatch.parallel.attention.group import SequenceGroup
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.sequence import SequenceParallel

    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    solo = Comm(None, CommLedger())
    for strategy in ("pipefusion", "distrifusion"):
        with pytest.raises(ValueError, match=f"QwenImage21Transformer2DModel attends block-causally over a cached "
                                             f"prefix, which stale-K/V attention \\({strategy}: .*run it with "
                                             "--ulysses or --ring, --tp, --cfg or --dp"):
            SequenceParallel(pipe.transformer, SequenceGroup(ulysses=solo, ring=solo, sp=solo), strategy)


@pytest.mark.slow
def test_a_batch_equals_its_rows_one_by_one(tmp_path):
    # two rows of one prompt share a layout (one forward); a third prompt's length makes another group
    image = random_image(tmp_path / "in.png", (64, 48))
    rows = [replace(job(PRESET, num_inference_steps=2, seed=30 + index, prompt=prompt, guidance_scale=4.0,
                        negative_prompt="grey", image=image), id=f"row{index}", row=index)
            for index, prompt in enumerate(("a red fox", "a red fox", "a lighthouse on a cliff at dusk"))]
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        batched = drive.generate_batch(executor, rows, JobTimer(world.ctx.device))
        alone = [drive.generate(executor, row, JobTimer(world.ctx.device)) for row in rows]
    for index, row in enumerate(rows):
        np.testing.assert_allclose(batched[index], alone[index], rtol=0, atol=1e-5, err_msg=row.id)
    assert np.abs(batched[0] - batched[1]).max() > 0.05 and np.abs(batched[0] - batched[2]).max() > 0.05


def _batch_under(rank, world_size, rows, out, layout):
    with job_executor(out, model=PRESET, **layout) as (world, executor):
        return drive.denoise_batch(executor, rows, JobTimer(world.ctx.device))


@pytest.mark.slow
def test_a_batch_under_ulysses_and_ring_equals_one_process(tmp_path):
    # two rows of one prompt share a layout (one forward of two rows through the kept prefix), a third runs alone
    image = random_image(tmp_path / "in.png", (64, 48))
    rows = [replace(job(PRESET, width=96, height=96, num_inference_steps=3, seed=50 + index, prompt=prompt,
                        guidance_scale=4.0, negative_prompt="grey", image=image), id=f"row{index}", row=index)
            for index, prompt in enumerate(("a red fox", "a red fox", "a lighthouse on a cliff at dusk"))]
    reference = _batch_under(0, 1, rows, str(tmp_path / "one"), {})
    for layout in ({"ulysses": 2}, {"ring": 2}):
        for rank, latents in enumerate(run_on_ranks(_batch_under, 2, args=(rows, str(tmp_path / str(layout)), layout),
                                                     timeout_s=120)):
            diff = (latents - reference).abs().max().item()
            assert diff <= 1e-5, f"{layout}: rank {rank} latents differ by {diff}"


@pytest.mark.slow
def test_compiled_ulysses_and_ring_equal_one_eager_process(tmp_path):
    spec_job = replace(_layouts_job(tmp_path), id="compiled")
    reference = _batch_under(0, 1, [spec_job], str(tmp_path / "one"), {})
    for layout in ({"ulysses": 2}, {"ring": 2}):
        compiled = dict(layout, compile=True, compile_backend="aot_eager")
        for rank, latents in enumerate(run_on_ranks(_batch_under, 2, args=([spec_job], str(tmp_path / str(layout)),
                                                                            compiled), timeout_s=300)):
            diff = (latents - reference).abs().max().item()
            assert diff <= 1e-4, f"{layout}: rank {rank} latents differ by {diff}"  # compile's fusions: 1e-4


WIDE_VAE = dict(TINY_VAE, base_dim=8, decoder_base_dim=12, dim_mult=[1, 2, 4, 8, 8], z_dim=16)
"""The published layout (channel multipliers 1-2-4-8-8, the decoder wider than the encoder) at 1/12 of its width."""
VAE_CASES = [("tiny", (1, 16, 1, 7, 6)), ("tiny", (1, 16, 1, 3, 6)), ("wide", (1, 16, 1, 5, 7)),
             ("wide", (2, 16, 1, 6, 3))]
"""(config, latent): heights that do not divide by 2 or 4, a short one (2-D tiles at 4 ranks), a batch of two."""


def _vae(config: str):
    from diffusers import AutoencoderKLQwenImage21

    torch.manual_seed(0)
    return AutoencoderKLQwenImage21(**(TINY_VAE if config == "tiny" else WIDE_VAE)).eval()


def _parallel_vae(rank, world_size):
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_decode
    from genbatch.parallel.vae.encode import parallel_encode

    results = []
    for config, shape in VAE_CASES:
        vae = _vae(config)
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        pixels = torch.rand((shape[0], 4, 1, shape[3] * 16, shape[4] * 16), generator=torch.Generator().manual_seed(2))
        comm = Comm(dist.group.WORLD, CommLedger())
        with torch.no_grad():
            image = parallel_decode(vae, latents, comm, leader_only=False)
            decoded = (image - vae.decode(latents).sample).abs().max().item()
            moments = parallel_encode(vae, pixels * 2 - 1, comm).parameters
            encoded = (moments - vae.encode(pixels * 2 - 1).latent_dist.parameters).abs().max().item()
        results.append((decoded, encoded, comm.ledger.take()))
    return results


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_vae_decodes_and_encodes_patch_parallel_as_one_rank(world_size):
    from genbatch.parallel.vae import supports_parallel_decode
    from genbatch.parallel.vae.encode import supports_parallel_encode

    assert supports_parallel_decode(_vae("wide")) and supports_parallel_encode(_vae("wide"))
    per_rank = run_on_ranks(_parallel_vae, world_size, timeout_s=120)
    for rank, results in enumerate(per_rank):
        for (config, shape), (decoded, encoded, sent) in zip(VAE_CASES, results, strict=True):
            assert decoded <= 1e-4 and encoded <= 1e-4, (rank, config, shape, decoded, encoded)
            assert sum(sent.values()) > 0, "the tiles exchanged halos"


@pytest.mark.slow
def test_a_lora_equals_diffusers_load_lora_weights(tmp_path):
    from genbatch.jobs.lora import LoraRef
    from tests.support.lora import peft_lora

    path = peft_lora(PRESET, tmp_path / "lora", ("to_q", "to_v", "to_out.0", "img_mlp.proj", "img_mlp.out"), seed=1)
    spec_job = job(PRESET, num_inference_steps=2, seed=4, lora=(LoraRef(path, 0.8),))
    with job_executor(str(tmp_path / "out"), model=PRESET) as (world, executor):
        ours = drive.generate(executor, spec_job, JobTimer(world.ctx.device))
        base = drive.generate(executor, replace(spec_job, lora=()), JobTimer(world.ctx.device))
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    pipe.load_lora_weights(path, adapter_name="row")
    pipe.set_adapters("row", 0.8)
    theirs = pipe(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width, num_inference_steps=2,
                  generator=torch.Generator("cpu").manual_seed(4), output_type="np").images[0][..., :3]
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(ours - base).max() > 0.01  # the adapter moved it


@pytest.mark.slow
def test_a_sample_sigmas_grid_sets_the_steps_and_the_hub_id_resolves(directory, tmp_path, monkeypatch):
    import shutil

    from tests.support.hub import add_snapshot

    turbo = tmp_path / "turbo"
    shutil.copytree(directory, turbo)
    index = json.loads((turbo / "model_index.json").read_text())
    (turbo / "model_index.json").write_text(json.dumps({**index, "sample_sigmas": [1.0, 0.75, 0.5]}))
    cache = str(tmp_path / "hub")
    snapshot = add_snapshot(cache, "Qwen/Qwen-Image-2.1", directory, "0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    try:
        spec = resolve_model("Qwen/Qwen-Image-2.1")
        assert (spec.family, spec.path, spec.size_multiple, spec.media_inputs) == ("qwen-image-21", snapshot, 32,
                                                                                   ("image",))
        assert spec.defaults["num_inference_steps"] == 40 and spec.defaults["guidance_scale"] == 1.0  # __call__'s
        assert resolve_model(str(turbo)).defaults["num_inference_steps"] == 3
        spec_job = job(PRESET, model=str(turbo), num_inference_steps=3, seed=2)
        ours = genbatch_frames(str(turbo), spec_job, str(tmp_path / "out"))
        # the pipeline samples the grid whatever num_inference_steps it is given
        theirs = pipeline_frames(str(turbo), replace(spec_job, num_inference_steps=7))[..., :3]
        np.testing.assert_array_equal(ours, theirs)
        pipe = load_pipeline(resolve_model(str(turbo)), torch.device("cpu"), torch.float32)
        with pytest.raises(ValueError, match="3-step sigma grid.*set num_inference_steps to 3"):
            family("qwen-image-21").hooks.trajectory(pipe, PreparedJob.of(replace(spec_job, num_inference_steps=5)),
                                                      torch.Generator().manual_seed(0), torch.device("cpu"))
    finally:
        resolve_model.cache_clear()


@pytest.mark.slow
def test_compile_equals_eager_taylorseer_runs_and_fbc_is_refused(tmp_path):
    spec_job = job(PRESET, num_inference_steps=3, seed=5, guidance_scale=4.0, negative_prompt="grey")
    with job_executor(str(tmp_path / "eager"), model=PRESET) as (world, executor):
        eager = drive.denoise(executor, spec_job, JobTimer(world.ctx.device))
        # TaylorSeer's warm-up runs the first step (the prefix's) and the next two in full, then predicts the
        # attention of the output's tokens; the prefix's cached keys and values are read, never rewritten
        steps = replace(spec_job, num_inference_steps=6)
        full = drive.denoise(executor, steps, JobTimer(world.ctx.device))
        with drive.hook_summaries() as summaries:
            cached = drive.denoise(executor, replace(steps, cache="taylorseer:2"), JobTimer(world.ctx.device))
        assert summaries[-1]["cache_hooked"] > 0
        assert 0 < (cached - full).abs().max().item() < full.abs().max().item()
        with pytest.raises(ValueError, match="QwenImage21TransformerBlock is not a transformer block diffusers' "
                                             "First-Block Cache knows; run this model with --cache none or --cache "
                                             "taylorseer:N"):
            drive.denoise(executor, replace(spec_job, cache="fbc:0.2"), JobTimer(world.ctx.device))
    with job_executor(str(tmp_path / "compiled"), model=PRESET, compile=True, compile_backend="aot_eager") as (
            world, executor):
        compiled = [drive.denoise(executor, replace(spec_job, seed=seed), JobTimer(world.ctx.device)) for seed in (5, 6)]
    assert (compiled[0] - eager).abs().max().item() <= 1e-4
    assert (compiled[1] - eager).abs().max().item() > 1e-3  # another seed through the same graphs


def test_the_planner_ranks_ulysses_and_ring_and_no_stale_layout_for_it():
    from genbatch.parallel.dims import ParallelDims
    from genbatch.planner.hardware import make_cluster
    from genbatch.planner.layouts import structural_problems
    from genbatch.planner.shapes import resolve_shape

    for name in ("qwen-image-2.1", PRESET):
        shape = resolve_shape(name)
        assert shape.sequence_parallel and not shape.patch_parallel and not shape.pipeline_stages, name
    shape = resolve_shape("qwen-image-2.1")
    cluster = make_cluster(8)
    for layout in (ParallelDims(dp=4, ulysses=2), ParallelDims(dp=4, ring=2), ParallelDims(dp=4, tp=2)):
        assert not structural_problems(layout, shape, 4352, 40, cluster), layout
    assert any("distrifusion=2 needs patches whose keys can go stale" in problem for problem in structural_problems(
        ParallelDims(dp=4, distrifusion=2), shape, 4352, 40, cluster))
    assert any("pp=2 needs PipeFusion stages" in problem for problem in structural_problems(
        ParallelDims(dp=4, pp=2), shape, 4352, 40, cluster))
