"""`--compile` with batches: batches of 3, 1 and 2 rows compile at most three times per block class (a static
graph, one with a symbolic batch size, and the batch of one, a size dynamo specialises), never once per batch
size, and the compiled batches equal the eager ones (aot_eager runs the eager kernels)."""

from __future__ import annotations

from dataclasses import replace

import torch

from genbatch.parallel.compile import CLOCK
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor

BASE = job("tiny-wan", num_inference_steps=2)
ROWS = [replace(BASE, id=f"row{index}", prompt=f"a paper boat on a pond, take {index}", seed=index, row=index)
        for index in range(6)]
BATCHES = [ROWS[:3], ROWS[3:4], ROWS[4:]]


def _latents(out: str, compile: bool) -> tuple[list[torch.Tensor], dict, int]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    CLOCK.counts.clear()
    CLOCK.take()
    with job_executor(out, compile=compile, compile_backend="aot_eager") as (world, executor):
        latents = [drive.denoise_batch(executor, batch, JobTimer(world.ctx.device)) for batch in BATCHES]
    return latents, dict(CLOCK.counts), sum(counters["graph_break"].values())


def test_batches_of_three_sizes_compile_at_most_three_times_and_equal_eager(tmp_path):
    eager, _, _ = _latents(str(tmp_path / "eager"), False)
    compiled, compiles, breaks = _latents(str(tmp_path / "compiled"), True)
    assert breaks == 0
    assert 1 <= compiles["WanTransformerBlock"] <= 3, compiles
    for batch, ours, theirs in zip(BATCHES, compiled, eager, strict=True):
        assert ours.shape[0] == len(batch)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
