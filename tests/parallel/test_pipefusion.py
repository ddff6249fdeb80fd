"""PipeFusion (gloo, tiny random models): the layers cut into stages over the pp axis.

With the warm-up covering every step (pure layer pipelining: the whole latent goes stage to stage) the output
equals one process within 1e-5 on fp32 latents: pipefusion 2, pipefusion 2 x ulysses 2, cfg 2 x pipefusion 2.
"""

from __future__ import annotations

import pytest
import torch

from genbatch.parallel.patch.config import NAIVE_PATCH, PIPEFUSION, StaleConfig
from genbatch.runner.timing import JobTimer
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 3


def _latents(out: str, layout: dict, preset: str, stale=None, seeds=(7,), steps=STEPS) -> dict:
    with job_executor(out, **layout) as (world, executor):
        executor.stale = stale
        results = {}
        for seed in seeds:
            timer = JobTimer(world.ctx.device)
            results[seed] = executor.denoise(job(preset, num_inference_steps=steps, seed=seed), timer)
        return {"latents": results,
                "bytes": [{k: v for k, v in row.items() if k.startswith("bytes_")}
                          for row in timer.rows() if row["stage"] == "denoise_step"]}


def _on_rank(rank, world_size, out, layout, preset, stale, seeds, steps):
    return _latents(f"{out}/rank{rank}", layout, preset, stale, seeds, steps)


def _distributed(tmp_path, preset, layout, stale=None, seeds=(7,), steps=STEPS):
    world = 1
    for value in layout.values():
        world *= value
    return run_on_ranks(_on_rank, world, args=(str(tmp_path), layout, preset, stale, seeds, steps), timeout_s=30)


@pytest.mark.parametrize(("preset", "layout"), [
    ("tiny-wan", {"pp": 2}), ("tiny-flux", {"pp": 2}), ("tiny-sd3", {"pp": 2}),
    ("tiny-wan", {"pp": 2, "ulysses": 2}), ("tiny-wan", {"cfg": 2, "pp": 2}),
    ("tiny-flux", {"pp": 2, "ulysses": 2}), ("tiny-sd3", {"pp": 2, "ulysses": 2}),
], ids=["wan-pp2", "flux-pp2", "sd3-pp2", "wan-pp2-ulysses2", "wan-cfg2-pp2", "flux-pp2-ulysses2", "sd3-pp2-ulysses2"])
def test_pure_layer_pipelining_equals_one_process(preset, layout, tmp_path):
    reference = _latents(str(tmp_path / "single"), {}, preset)["latents"][7]
    stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=STEPS)
    for result in _distributed(tmp_path, preset, layout, stale):
        torch.testing.assert_close(result["latents"][7], reference, rtol=0, atol=1e-5)


def _mse(ours: dict, exact: dict) -> float:
    return sum(float((ours[seed] - exact[seed]).pow(2).mean()) for seed in exact) / len(exact)


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux", "tiny-sd3"])
def test_stale_kv_errs_at_most_half_as_much_as_naive_patches(preset, tmp_path):
    seeds, steps = (1, 2), 6
    exact = _latents(str(tmp_path / "single"), {}, preset, None, seeds, steps)["latents"]
    errors = {}
    for method, patches in ((PIPEFUSION, 2), (PIPEFUSION, 4), (NAIVE_PATCH, 2), (NAIVE_PATCH, 4)):
        stale = StaleConfig(method=method, patches=patches, warmup_steps=1)
        ranks = _distributed(tmp_path / f"{method}{patches}", preset, {"pp": 2}, stale, seeds, steps)
        assert all(torch.equal(ranks[1]["latents"][s], ranks[0]["latents"][s]) for s in seeds)  # one latent
        errors[(method, patches)] = _mse(ranks[0]["latents"], exact)
    print(preset, errors)
    for patches in (2, 4):
        assert 0 < errors[(PIPEFUSION, patches)] <= 0.5 * errors[(NAIVE_PATCH, patches)], errors
