"""DistriFusion (gloo, 2 processes, tiny random models): patch parallel over stale K/V.

- With the warm-up covering every step (pure patch parallelism, every K/V gathered at once) each model's
  output equals one process within 1e-5 on fp32 latents.
- With one warm-up step the error against that exact run is measured as MSE on fp32 latents, over fixed
  seeds: DistriFusion's is at most half naive patch parallel's (the same patches, each attending only to
  itself). An ordering that can fail.
"""

from __future__ import annotations

import pytest
import torch

from genbatch.parallel.stale import DISTRIFUSION, NAIVE_PATCH, StaleConfig
from genbatch.runner.timing import JobTimer
from tests.parallel.stale_runs import denoised, mse, on_ranks
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 4


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux", "tiny-sd3"])
def test_a_warm_up_over_every_step_equals_one_process(preset, tmp_path):
    reference = denoised(str(tmp_path / "single"), {}, preset, None, (7,), STEPS)["latents"][7]
    stale = StaleConfig(method=DISTRIFUSION, patches=2, warmup_steps=STEPS)
    for result in on_ranks(tmp_path, preset, {"distrifusion": 2}, stale, (7,), STEPS):
        torch.testing.assert_close(result["latents"][7], reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux", "tiny-sd3"])
def test_stale_kv_errs_at_most_half_as_much_as_naive_patches(preset, tmp_path):
    seeds, steps = (1, 2), 6
    exact = denoised(str(tmp_path / "single"), {}, preset, None, seeds, steps)["latents"]
    errors = {}
    for method in (DISTRIFUSION, NAIVE_PATCH):
        stale = StaleConfig(method=method, patches=2, warmup_steps=1)
        ranks = on_ranks(tmp_path / method, preset, {"distrifusion": 2}, stale, seeds, steps)
        assert all(torch.equal(ranks[1]["latents"][s], ranks[0]["latents"][s]) for s in seeds)  # one latent
        errors[method] = mse(ranks[0]["latents"], exact)
    print(preset, errors)
    assert 0 < errors[DISTRIFUSION] <= 0.5 * errors[NAIVE_PATCH], errors


def _resume_on_rank(rank, world_size, out, steps, every, warmup):
    from genbatch.runner.checkpoint import CheckpointPolicy

    stale = StaleConfig(method=DISTRIFUSION, patches=2, warmup_steps=warmup)
    first = job("tiny-wan", num_inference_steps=steps, seed=3)
    policy = CheckpointPolicy(every_steps=every)
    with job_executor(f"{out}/resumed", distrifusion=2, checkpoints=policy) as (world, executor):
        drive.use_stale(executor, stale)
        checkpointed = drive.denoise(executor, first, JobTimer(world.ctx.device))  # checkpoints after step `every`
        executor.writer.flush()
        timer = JobTimer(world.ctx.device)
        resumed = drive.denoise(executor, first, timer)  # a new session: resumes at `every`
        timed = [row["step"] for row in timer.rows() if row["stage"] == "denoise_step"]
        drive.use_stale(executor, StaleConfig(method=DISTRIFUSION, patches=2, warmup_steps=warmup + 1))
        drive.denoise(executor, first, JobTimer(world.ctx.device))  # checkpoints again after step `every`
        executor.writer.flush()
        drive.use_stale(executor, stale)
        timer = JobTimer(world.ctx.device)
        drive.denoise(executor, first, timer)  # that checkpoint was made under another warm-up: starts over
        restarted = [row["step"] for row in timer.rows() if row["stage"] == "denoise_step"]
    plain = denoised(f"{out}/plain", {"distrifusion": 2}, "tiny-wan", stale, (3,), steps)["latents"][3]
    rewarmed = range(every, every + warmup)
    reference = denoised(f"{out}/reference", {"distrifusion": 2}, "tiny-wan", stale, (3,), steps,
                         resync=rewarmed)["latents"][3]
    return {"checkpointed": checkpointed, "plain": plain, "resumed": resumed, "reference": reference, "timed": timed,
            "restarted": restarted}


def test_a_resumed_job_rewarms_and_equals_the_run_synchronous_at_those_steps(tmp_path):
    for result in run_on_ranks(_resume_on_rank, 2, args=(str(tmp_path), 6, 3, 2), timeout_s=30):
        assert result["timed"] == [3, 4, 5]  # the second run resumed after step 3
        assert result["restarted"] == list(range(6))  # a changed approximation setting restarts the job        assert torch.equal(result["checkpointed"], result["plain"])  # a periodic checkpoint changes nothing
        torch.testing.assert_close(result["resumed"], result["reference"], rtol=0, atol=1e-5)
        assert (result["resumed"] - result["plain"]).abs().max() > 1e-6  # the re-warm steps did differ


def test_bytes_and_stale_kv_memory_per_rank_follow_the_formulas(tmp_path):
    from genbatch.models import resolve_model

    preset, steps = "tiny-wan", 3
    stale = StaleConfig(method=DISTRIFUSION, patches=2, warmup_steps=1)
    spec, sized = resolve_model(preset), job(preset)
    tokens, width, layers = spec.tokens(sized.width, sized.height, sized.num_frames), spec.hidden_size, spec.num_layers
    branches, value = 2, 4  # both CFG branches on each rank, fp32
    for result in on_ranks(tmp_path, preset, {"distrifusion": 2}, stale, (7,), steps):
        # every layer's K and V of this rank's N/P tokens, to the P-1 others, per branch, every step
        sent = 2 * (tokens // 2) * width * (2 - 1) * layers * branches * value
        for row in result["bytes"]:
            assert abs(row["bytes_stale_kv"] - sent) <= 0.05 * sent, (row, sent)
        # kept: the K and V of all N tokens for every layer, per branch (2 x N x d x L)
        kept = 2 * tokens * width * layers * branches * value
        assert abs(result["stale_bytes"] - kept) <= 0.05 * kept, (result["stale_bytes"], kept)
