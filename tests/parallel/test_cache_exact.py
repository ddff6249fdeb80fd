"""Step caching in one process, through `JobExecutor.denoise`.

`fbc:0` and `taylorseer:1` skip nothing and give the uncached latents bit for bit (tiny-wan, tiny-flux). With
a threshold that skips, the step rows count the skipped branch forwards; TaylorSeer really hooks Wan's
modules; each guidance branch and each Wan 2.2 expert keeps its own state; every job starts from empty
state and leaves no hook behind; a resumed job's first step computes in full, and a checkpoint taken under
another cache mode is not resumed."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from genbatch.jobs.cache import parse_cache
from genbatch.models import resolve_model
from genbatch.parallel.cache.session import SKIPPED, StepCache
from genbatch.parallel.comm import Comm, CommLedger
from genbatch.runner.execute import JobInterrupted, JobModel
from genbatch.runner.timing import JobTimer
from tests.resume.inprocess import SignalAfterStep, executor_on
from tests.support import executor as drive
from tests.support.runs import job, job_executor

STEPS = 6


def _run(executor, spec, timer=None, model=None):
    """(latents, per-step skipped counts, what the job's step cache measured: its indicators, modules hooked)."""
    timer = timer or JobTimer(executor.ctx.device)
    with drive.hook_summaries() as summaries:
        latents = drive.denoise(executor, spec, timer, model)
    skipped = [row.get(SKIPPED) for row in timer.rows() if row["stage"] == "denoise_step"]
    summary = summaries[-1]
    return latents, skipped, SimpleNamespace(indicators=summary.get("cache_indicators", []),
                                             hooked=summary.get("cache_hooked", 0))


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    with job_executor(str(tmp_path_factory.mktemp("out"))) as (_, executor):
        yield executor


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux", "tiny-sd3", "tiny-qwen-image", "tiny-hunyuan-video"])
def test_a_cache_that_skips_nothing_equals_no_cache_bit_for_bit(preset, tmp_path):
    with job_executor(str(tmp_path)) as (_, executor):
        exact, skipped, _ = _run(executor, job(preset, num_inference_steps=STEPS))
        assert skipped == [None] * STEPS  # no cache: no column
        for mode in ("fbc:0", "taylorseer:1"):
            latents, skipped, cache = _run(executor, job(preset, num_inference_steps=STEPS, cache=mode))
            assert cache.hooked > 0
            assert skipped == [0] * STEPS, mode
            assert torch.equal(latents, exact), mode
        for mode in ("fbc:0.5", "taylorseer:2"):  # every family skips (SD3's last block drops the text stream)
            latents, skipped, _ = _run(executor, job(preset, num_inference_steps=STEPS, cache=mode))
            assert sum(skipped) > 0 and torch.isfinite(latents).all(), mode


def test_a_threshold_skips_and_the_step_rows_count_the_skipped_branches(wan):
    exact, _, _ = _run(wan, job("tiny-wan", num_inference_steps=STEPS))
    latents, skipped, cache = _run(wan, job("tiny-wan", num_inference_steps=STEPS, cache="fbc:0.5"))
    assert skipped[0] == 0 and sum(skipped) > 0 and max(skipped) <= 2  # two branches (cond, uncond) per step
    indicators = [value for _, _, value in cache.indicators if value is not None]
    assert len(cache.indicators) == 2 * STEPS and all(value > 0 for value in indicators)
    assert sum(skipped) == sum(value <= 0.5 for value in indicators)  # every skip is a decision below the bar
    assert not torch.equal(latents, exact) and torch.isfinite(latents).all()


def test_taylorseer_predicts_on_its_schedule_and_hooks_wans_modules(wan):
    _, skipped, cache = _run(wan, job("tiny-wan", num_inference_steps=8, cache="taylorseer:2"))
    # three warm-up steps, then one full step in every two: both branches predicted on steps 3, 5, 7
    assert skipped == [0, 0, 0, 2, 0, 2, 0, 2]
    model = wan.model_for(job("tiny-wan")).pipe.transformer
    blocks = len(model.blocks)
    assert cache.hooked == 3 * blocks  # attn1, attn2 and the feed-forward of every block
    # diffusers' own patterns (fullmatched) hook nothing in Wan: the reason genbatch chooses the modules
    defaults = ("^blocks.*attn", "^transformer_blocks.*attn", "^single_transformer_blocks.*attn")
    assert not [name for name, _ in model.named_modules() if any(re.fullmatch(p, name) for p in defaults)]


def test_each_job_starts_from_empty_state_and_leaves_no_hook(wan):
    spec = job("tiny-wan", num_inference_steps=STEPS, cache="fbc:0.5")
    first, first_skipped, first_cache = _run(wan, spec)
    again, again_skipped, again_cache = _run(wan, spec)
    assert torch.equal(first, again) and first_skipped == again_skipped
    assert first_cache.indicators == again_cache.indicators
    assert [value for step, _, value in again_cache.indicators if step == 0] == [None, None]  # cond, uncond
    model = wan.model_for(spec).pipe.transformer
    hooks = [name for module in model.modules() if hasattr(module, "_diffusers_hook")
             for name in module._diffusers_hook.hooks]
    assert hooks == []


def test_each_guidance_branch_keeps_its_own_state(wan):
    _, _, cache = _run(wan, job("tiny-wan", num_inference_steps=3, cache="fbc:0"))
    assert [(step, branch) for step, branch, _ in cache.indicators] == [
        (0, "cond"), (0, "uncond"), (1, "cond"), (1, "uncond"), (2, "cond"), (2, "uncond")]
    by_branch = {branch: [value for _, b, value in cache.indicators if b == branch] for branch in ("cond", "uncond")}
    assert by_branch["cond"][0] is None and by_branch["uncond"][0] is None
    assert by_branch["cond"][1:] != by_branch["uncond"][1:]  # each compared with its own last step


def test_wan_2_2_experts_keep_separate_state(wan):
    from diffusers import WanPipeline, WanTransformer3DModel

    from genbatch import models
    from genbatch.models import tiny_configs

    base = wan.model_for(job("tiny-wan")).pipe
    torch.manual_seed(5)
    low_noise = WanTransformer3DModel(**tiny_configs.TINY_WAN_TRANSFORMER).eval()
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer, transformer_2=low_noise,
                       boundary_ratio=0.6)
    spec = resolve_model("tiny-wan")
    model = JobModel(spec=spec, family_hooks=models.family(spec.family).hooks, pipe=pipe)
    _, _, cache = _run(wan, job("tiny-wan", num_inference_steps=STEPS, cache="fbc:0"), model=model)
    fresh = [step for step, _, value in cache.indicators if value is None]
    # each expert's first step of each branch starts from empty state (the second expert's at the boundary)
    assert len(fresh) == 4 and fresh[:2] == [0, 0] and fresh[2] == fresh[3] > 0
    session = StepCache.start(pipe, spec, parse_cache("fbc:0"), Comm(None, CommLedger()))
    try:
        assert len(session.models) == 2
    finally:
        session.close()  # its hooks sit on the shared executor's transformer: the next test must find none


def test_a_resumed_job_computes_its_first_step_in_full(tmp_path):
    spec = job("tiny-wan", id="wan", num_inference_steps=8, cache="fbc:0.5")
    with executor_on(str(tmp_path)) as harness:
        timer = SignalAfterStep(harness.device, step=3)
        with pytest.raises(JobInterrupted, match="after step 4"):
            drive.denoise(harness.executor, spec, timer)
        before = [row[SKIPPED] for row in timer.rows() if row["stage"] == "denoise_step"]
        harness.writer.flush()
    assert sum(before[1:]) > 0  # it was skipping before the stop
    with executor_on(str(tmp_path)) as harness:
        latents, skipped, cache = _run(harness.executor, spec, SignalAfterStep(harness.device))
    assert len(skipped) == 4 and skipped[0] == 0  # resumed at step 4, computed in full (the state is not kept)
    assert [value for step, _, value in cache.indicators if step == 4] == [None, None]
    assert torch.isfinite(latents).all()


def test_a_checkpoint_of_another_cache_mode_is_not_resumed(tmp_path):
    spec = job("tiny-wan", id="wan", num_inference_steps=6, cache="fbc:0.5")
    with executor_on(str(tmp_path)) as harness:
        with pytest.raises(JobInterrupted):
            drive.denoise(harness.executor, spec, SignalAfterStep(harness.device, step=1))
        harness.writer.flush()
    with executor_on(str(tmp_path)) as harness:
        timer = SignalAfterStep(harness.device)
        drive.denoise(harness.executor, job("tiny-wan", id="wan", num_inference_steps=6, cache="none"), timer)
    assert timer.steps() == list(range(6))  # started over: the mode is part of the fingerprint
