"""PipeFusion (gloo, tiny random models): the layers cut into stages over the pp axis.

With the warm-up covering every step (pure layer pipelining: the whole latent goes stage to stage) the output
equals one process within 1e-5 on fp32 latents (Wan, FLUX, SD3, Qwen-Image): pipefusion 2, pipefusion 2 x
ulysses 2, pipefusion 2 x ring 2, cfg 2 x pipefusion 2, and cfg 2 x pipefusion 2 with --fsdp (each stage's
weights sharded over its stage's two CFG ranks, filled from the leader by the whole model's names). The edit families (their input's tokens in
the image stream) are held to the same checks in tests/models/test_flux_kontext.py and test_qwen_image_edit.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from genbatch.parallel.stale import NAIVE_PATCH, PIPEFUSION, StaleConfig
from genbatch.runner.timing import JobTimer
from tests.parallel.stale_runs import denoised, mse, on_ranks
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 3


@pytest.mark.parametrize(("preset", "layout"), [
    ("tiny-wan", {"pp": 2}), ("tiny-flux", {"pp": 2}), pytest.param("tiny-sd3", {"pp": 2}),
    pytest.param("tiny-qwen-image", {"pp": 2}),
    pytest.param("tiny-wan", {"pp": 2, "ulysses": 2}),
    pytest.param("tiny-wan", {"cfg": 2, "pp": 2}),
    pytest.param("tiny-flux", {"pp": 2, "ulysses": 2}),
    pytest.param("tiny-sd3", {"pp": 2, "ulysses": 2}),
    pytest.param("tiny-wan", {"pp": 2, "ring": 2}),
    pytest.param("tiny-flux", {"pp": 2, "ring": 2}),
    pytest.param("tiny-wan", {"cfg": 2, "pp": 2, "fsdp": True}),
], ids=["wan-pp2", "flux-pp2", "sd3-pp2", "qwen-pp2", "wan-pp2-ulysses2", "wan-cfg2-pp2", "flux-pp2-ulysses2",
        "sd3-pp2-ulysses2", "wan-pp2-ring2", "flux-pp2-ring2", "wan-cfg2-pp2-fsdp"])
def test_pure_layer_pipelining_equals_one_process(preset, layout, tmp_path):
    reference = denoised(str(tmp_path / "single"), {}, preset, None, (7,), STEPS)["latents"][7]
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=STEPS)
    for result in on_ranks(tmp_path, preset, layout, stale, (7,), STEPS):
        torch.testing.assert_close(result["latents"][7], reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", [  # a video and a masked model in make test-slow; FLUX's and SD3's stay in make test
    pytest.param("tiny-wan", marks=pytest.mark.slow), "tiny-flux", "tiny-sd3",
    pytest.param("tiny-qwen-image", marks=pytest.mark.slow)])
def test_stale_kv_errs_at_most_half_as_much_as_naive_patches(preset, tmp_path):
    seeds, steps = (1, 2), 6
    exact = denoised(str(tmp_path / "single"), {}, preset, None, seeds, steps)["latents"]
    errors = {}
    for method, patches in ((PIPEFUSION, 2), (PIPEFUSION, 4), (NAIVE_PATCH, 2), (NAIVE_PATCH, 4)):
        stale = StaleConfig(method=method, patches=patches, warmup_steps=1)
        ranks = on_ranks(tmp_path / f"{method}{patches}", preset, {"pp": 2}, stale, seeds, steps)
        assert all(torch.equal(ranks[1]["latents"][s], ranks[0]["latents"][s]) for s in seeds)  # one latent
        errors[(method, patches)] = mse(ranks[0]["latents"], exact)
    print(preset, errors)
    for patches in (2, 4):
        assert 0 < errors[(PIPEFUSION, patches)] <= 0.5 * errors[(NAIVE_PATCH, patches)], errors


def _resume_on_rank(rank, world_size, out, steps, every, warmup):
    from genbatch.runner.checkpoint import CheckpointPolicy

    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=warmup)
    first = job("tiny-wan", num_inference_steps=steps, seed=3)
    with job_executor(f"{out}/resumed", pp=2, checkpoints=CheckpointPolicy(every_steps=every)) as (world, executor):
        drive.use_stale(executor, stale)
        checkpointed = drive.denoise(executor, first, JobTimer(world.ctx.device))  # checkpoints after step `every`
        executor.writer.flush()
        timer = JobTimer(world.ctx.device)
        resumed = drive.denoise(executor, first, timer)  # a new session: resumes at `every`, re-warms
        timed = [row["step"] for row in timer.rows() if row["stage"] == "denoise_step"]
    plain = denoised(f"{out}/plain", {"pp": 2}, "tiny-wan", stale, (3,), steps)["latents"][3]
    with job_executor(f"{out}/reference", pp=2) as (world, executor):
        drive.use_stale(executor, stale, range(every, every + warmup))
        reference = drive.denoise(executor, first, JobTimer(world.ctx.device))
    return {"checkpointed": checkpointed, "plain": plain, "resumed": resumed, "reference": reference, "timed": timed}


def test_a_resumed_job_rewarms_and_equals_the_run_synchronous_at_those_steps(tmp_path):
    for result in run_on_ranks(_resume_on_rank, 2, args=(str(tmp_path), 6, 3, 1), timeout_s=30):
        assert result["timed"] == [3, 4, 5]  # the second run resumed after step 3
        assert torch.equal(result["checkpointed"], result["plain"])  # a periodic checkpoint changes nothing
        torch.testing.assert_close(result["resumed"], result["reference"], rtol=0, atol=1e-5)
        assert (result["resumed"] - result["plain"]).abs().max() > 1e-6  # the re-warm step did differ


@pytest.mark.parametrize("layout", [{"pp": 2}, pytest.param({"pp": 2, "ulysses": 2}),
                                    pytest.param({"pp": 2, "ring": 2})],
                         ids=["pp2", "pp2-ulysses2", "pp2-ring2"])
def test_bytes_and_stale_kv_memory_per_rank_follow_the_formulas(layout, tmp_path):
    from genbatch.models import resolve_model

    preset, steps = "tiny-wan", 3
    u = layout.get("ulysses", 1) * layout.get("ring", 1)  # each sequence rank of a stage holds 1/u of it
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=1)
    spec, sized = resolve_model(preset), job(preset)
    tokens, width, layers = spec.tokens(sized.width, sized.height, sized.num_frames), spec.hidden_size, spec.num_layers
    latent = spec.out_channels * math.prod(spec.latent_shape(sized.width, sized.height, sized.num_frames))
    branches, value = 2, 4  # both CFG branches on each rank, fp32
    for result in on_ranks(tmp_path, preset, layout, stale, (7,), steps):
        stage = result["rank"] // u
        rows = result["bytes"]
        if stage == 0:  # N x d per step (in M pieces), per branch, this rank's 1/u of it
            assert [row.get("bytes_pp_activation", 0) for row in rows] == [tokens * width * branches * value // u] * 3
        else:  # the prediction returned in the warm-up step, the latent's parts in the next, none after the last
            assert [row.get("bytes_pp_latent", 0) for row in rows] == [latent * branches * value, latent * value, 0]
        # the K and V of all N tokens for this stage's L/P layers, per branch, this rank's heads/u
        kept = 2 * tokens * width * (layers // 2) * branches * value // u
        assert result["stale_bytes"] == kept, (result["stale_bytes"], kept)


@pytest.mark.parametrize("layout", [{"cfg": 2, "pp": 2}, {"pp": 2, "ulysses": 2}, {"pp": 2, "ring": 2}],
                         ids=["cfg2-pp2", "pp2-ulysses2", "pp2-ring2"])
def test_the_patch_pipeline_composes_with_cfg_ulysses_and_ring(layout, tmp_path):
    exact = denoised(str(tmp_path / "single"), {}, "tiny-wan", None, (1,), 6)["latents"][1]
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=1)
    ranks = on_ranks(tmp_path, "tiny-wan", layout, stale, (1,), 6)
    assert all(torch.equal(result["latents"][1], ranks[0]["latents"][1]) for result in ranks)  # one latent
    naive = on_ranks(tmp_path / "naive", "tiny-wan", {"pp": 2}, StaleConfig(method=NAIVE_PATCH, patches=2,
                                                                                warmup_steps=1), (1,), 6)
    error = float((ranks[0]["latents"][1] - exact).pow(2).mean())
    assert 0 < error <= 0.5 * float((naive[0]["latents"][1] - exact).pow(2).mean())


def test_wan_2_2_rewarms_where_its_second_expert_takes_over(tmp_path):
    from genbatch import models
    from genbatch.parallel.pipeline.session import PipeSession, switch_steps

    hooks = models.family("wan").hooks
    pipe = SimpleNamespace(transformer=object(), transformer_2=object(),
                           scheduler=SimpleNamespace(config=SimpleNamespace(num_train_timesteps=1000)))
    trajectory = SimpleNamespace(timesteps=torch.tensor([990.0, 800.0, 620.0, 580.0, 300.0, 10.0]),
                                 shared={"boundary_timestep": 600.0})
    assert switch_steps(hooks, pipe, trajectory) == [3]  # 580 is the first timestep below the boundary
    one_expert = SimpleNamespace(timesteps=trajectory.timesteps, shared={"boundary_timestep": None})
    assert switch_steps(hooks, pipe, one_expert) == []
    session = PipeSession(config=StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=2),
                          extra_sync=frozenset({3, 4}))
    assert [session.synchronous(index) for index in range(6)] == [True, True, False, True, True, False]


def _two_experts_of_one_model(path: str) -> None:
    """Wan 2.2's layout (two experts switched at a boundary timestep) whose experts are both tiny-wan's transformer:
    it denoises as tiny-wan does, except where a method treats the switch differently."""
    import copy

    from diffusers import WanPipeline

    from genbatch.models import resolve_model
    from genbatch.runner.loading import load_pipeline

    base = load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32)
    WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae, scheduler=base.scheduler,
                transformer=base.transformer, transformer_2=copy.deepcopy(base.transformer),
                boundary_ratio=0.6).save_pretrained(path)


def _expert_switch_rank(rank, world_size, out, path, steps, switch):
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=1)
    runs = {}
    for name, model, resync in (("two experts", path, ()), ("one, re-warmed there", None, (switch,)),
                                ("one", None, ())):
        with job_executor(f"{out}/{name}/rank{rank}", pp=2) as (world, executor):
            drive.use_stale(executor, stale, resync)
            spec = job("tiny-wan", num_inference_steps=steps, seed=7, **({"model": model} if model else {}))
            runs[name] = drive.denoise(executor, spec, JobTimer(world.ctx.device))
    return runs


def test_wan_2_2_rewarms_at_the_expert_switch_end_to_end(tmp_path):
    """Both experts hold the same weights, so the two-expert run must equal the one-expert run made synchronous
    at the switch step (and differ from the one that is not): the second expert's first W steps re-warm."""
    from genbatch import models
    from genbatch.parallel.pipeline.session import switch_steps
    from genbatch.runner.loading import load_pipeline

    path, steps = str(tmp_path / "wan22"), 6
    _two_experts_of_one_model(path)
    pipe = load_pipeline(models.resolve_model(path), torch.device("cpu"), torch.float32)
    pipe.scheduler.set_timesteps(steps)
    trajectory = SimpleNamespace(timesteps=pipe.scheduler.timesteps,
                                 shared={"boundary_timestep": 0.6 * pipe.scheduler.config.num_train_timesteps})
    (switch,) = switch_steps(models.family("wan").hooks, pipe, trajectory)
    assert 1 < switch < steps
    for runs in run_on_ranks(_expert_switch_rank, 2, args=(str(tmp_path), path, steps, switch), timeout_s=60):
        torch.testing.assert_close(runs["two experts"], runs["one, re-warmed there"], rtol=0, atol=1e-5)
        assert (runs["two experts"] - runs["one"]).abs().max() > 1e-6


def _directory_rank(rank, world_size, out, path, layout, stale, steps):
    with job_executor(f"{out}/rank{rank}", **layout) as (world, executor):
        drive.use_stale(executor, stale)
        return drive.denoise(executor, job("tiny-wan", model=path, num_inference_steps=steps, seed=7),
                                JobTimer(world.ctx.device))


@pytest.mark.parametrize("directory", [True, pytest.param(False)], ids=["directory", "preset"])
def test_stages_compose_with_tensor_parallel(directory, tmp_path):
    from genbatch.models import resolve_model
    from genbatch.runner.loading import load_pipeline
    from tests.parallel.test_tensor_loading import _save

    reference = denoised(str(tmp_path / "single"), {}, "tiny-wan", None, (7,), STEPS)["latents"][7]
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=STEPS)
    layout = {"pp": 2, "tp": 2}
    if directory:  # each stage reads its own blocks' tp parts from the safetensors, by their whole-model names
        path = str(tmp_path / "tiny-wan")
        _save(load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32), path)
        reference = _directory_rank(0, 1, str(tmp_path / "single-directory"), path, {}, None, STEPS)
        results = run_on_ranks(_directory_rank, 4, args=(str(tmp_path), path, layout, stale, STEPS), timeout_s=30)
    else:
        results = [result["latents"][7] for result in on_ranks(tmp_path, "tiny-wan", layout, stale, (7,), STEPS)]
    for latents in results:
        torch.testing.assert_close(latents, reference, rtol=0, atol=1e-5)
