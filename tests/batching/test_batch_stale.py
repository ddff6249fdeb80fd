"""PipeFusion and DistriFusion run a batch as they run its rows: on two gloo ranks, a batch of three FLUX rows
under each (one synchronous warm-up step, then stale K/V) equals each row run alone under the same method,
within fp32 rounding. The rows' stale K/V stay their own: nothing of one row leaks into another's attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from genbatch.parallel.stale import DISTRIFUSION, PIPEFUSION, StaleConfig
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

BASE = job("tiny-flux", width=64, height=48, num_inference_steps=4)
ROWS = [replace(BASE, id=f"row{index}", prompt=prompt, seed=60 + index, row=index)
        for index, prompt in enumerate(["a red boat", "a forest in fog", "a glass of milk"])]


def _batch_and_rows(rank, world_size, out, layout, stale):
    with job_executor(f"{out}/{rank}", **layout) as (world, executor):
        drive.use_stale(executor, stale)
        batched = drive.denoise_batch(executor, ROWS, JobTimer(world.ctx.device))
        alone = [drive.denoise(executor, row, JobTimer(world.ctx.device)) for row in ROWS]
        return batched, alone


@pytest.mark.parametrize(("method", "layout"), [(PIPEFUSION, {"pp": 2}), (DISTRIFUSION, {"distrifusion": 2})])
def test_a_batch_under_stale_kv_equals_its_rows_alone(method, layout, tmp_path):
    stale = StaleConfig(method=method, patches=2, warmup_steps=1)
    for batched, alone in run_on_ranks(_batch_and_rows, 2, args=(str(tmp_path), layout, stale), timeout_s=60):
        assert batched.shape[0] == len(ROWS)
        for index, latents in enumerate(alone):
            torch.testing.assert_close(batched[index : index + 1], latents, rtol=0, atol=1e-5)
