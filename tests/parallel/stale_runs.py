"""The runs the stale-K/V tests (PipeFusion, DistriFusion) compare: one job group's denoised latents by seed, each
step's bytes by collective kind and the K/V its buffers kept, in one process or on gloo ranks."""

from __future__ import annotations

import math

from genbatch.parallel.patch.session import STALE_BYTES
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor


def denoised(out: str, layout: dict, preset: str, stale, seeds, steps: int, resync=frozenset()) -> dict:
    """This process's run of `preset` under `layout` and the approximation `stale` (None: exact), once per seed;
    `resync`: further synchronous steps (the reference of a resumed run)."""
    with job_executor(out, **layout) as (world, executor), drive.hook_summaries() as summaries:
        drive.use_stale(executor, stale, resync)
        results = {}
        for seed in seeds:
            timer = JobTimer(world.ctx.device)
            results[seed] = drive.denoise(executor, job(preset, num_inference_steps=steps, seed=seed), timer)
        return {"latents": results, "stale_bytes": summaries[-1].get(STALE_BYTES, 0), "rank": world.ctx.rank,
                "bytes": [{k: v for k, v in row.items() if k.startswith("bytes_")}
                          for row in timer.rows() if row["stage"] == "denoise_step"]}


def _on_rank(rank, world_size, out, layout, preset, stale, seeds, steps):
    return denoised(f"{out}/rank{rank}", layout, preset, stale, seeds, steps)


def on_ranks(tmp_path, preset: str, layout: dict, stale, seeds, steps: int) -> list[dict]:
    """`denoised` on as many gloo ranks as `layout`'s degrees make, by rank."""
    return run_on_ranks(_on_rank, math.prod(layout.values()),
                        args=(str(tmp_path), layout, preset, stale, seeds, steps), timeout_s=30)


def mse(ours: dict, exact: dict) -> float:
    """The mean squared error of latents by seed against the exact ones, averaged over the seeds."""
    return sum(float((ours[seed] - exact[seed]).pow(2).mean()) for seed in exact) / len(exact)
