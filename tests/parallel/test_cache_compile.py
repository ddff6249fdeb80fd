"""Step caching with `--compile`: First-Block Cache's hooks wrap each block's compiled forward from outside,
so a skipping threshold adds no graph break and no graph (aot_eager: dynamo's tracing, no code generation)
and gives the eager cached latents. TaylorSeer's hooks sit inside the blocks: a row asking for it in blocks
compiled whole fails its job naming the fix; given to the run (`--cache taylorseer:N --compile`), the blocks
compile around its hooks, which run eagerly, and the output is the eager TaylorSeer output; the hooks stay for
later jobs, so those compile nothing more, and a job without caching passes through them unchanged."""

from __future__ import annotations

import pytest
import torch

from genbatch.parallel.compile import CLOCK
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor, run_cli, write_manifest


def test_fbc_hooks_sit_outside_the_compiled_blocks(tmp_path):
    from torch._dynamo.utils import counters

    spec = job("tiny-wan", num_inference_steps=4, cache="fbc:0.5")
    with job_executor(str(tmp_path / "eager")) as (world, executor):
        eager_timer = JobTimer(world.ctx.device)
        eager = drive.denoise(executor, spec, eager_timer)
    torch._dynamo.reset()
    counters.clear()
    CLOCK.counts.clear()
    with job_executor(str(tmp_path / "compiled"), compile=True, compile_backend="aot_eager") as (world, executor):
        timer = JobTimer(world.ctx.device)
        compiled = drive.denoise(executor, spec, timer)
        skipped = [row["cache_skipped"] for row in timer.rows() if row["stage"] == "denoise_step"]
        with pytest.raises(ValueError, match="inside WanTransformer3DModel's blocks, compiled whole; give the run"):
            drive.denoise(executor, job("tiny-wan", num_inference_steps=2, cache="taylorseer:2"), JobTimer(world.ctx.device))
        model = executor.model_for(spec).pipe.transformer
        assert not [m for m in model.modules() if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks]
    assert sum(skipped) > 0
    assert skipped == [row["cache_skipped"] for row in eager_timer.rows() if row["stage"] == "denoise_step"]
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == sum(CLOCK.counts.values()) == 1  # one graph for Wan's block
    assert (compiled - eager).abs().max().item() <= 1e-4


def test_taylorseer_runs_with_compile_around_its_hooks_and_compiles_once(tmp_path):
    from torch._dynamo.utils import counters

    cached = job("tiny-wan", num_inference_steps=6, cache="taylorseer:2")
    plain = job("tiny-wan", num_inference_steps=3)
    with job_executor(str(tmp_path / "eager")) as (world, executor):
        eager = drive.denoise(executor, cached, JobTimer(world.ctx.device))
        eager_plain = drive.denoise(executor, plain, JobTimer(world.ctx.device))
    torch._dynamo.reset()
    counters.clear()
    CLOCK.counts.clear()
    with job_executor(str(tmp_path / "compiled"), compile=True, compile_backend="aot_eager",
                      cache="taylorseer:2") as (world, executor):
        timer = JobTimer(world.ctx.device)
        compiled = drive.denoise(executor, cached, timer)
        skipped = [row["cache_skipped"] for row in timer.rows() if row["stage"] == "denoise_step"]
        compiles = dict(CLOCK.counts)
        again = drive.denoise(executor, cached, JobTimer(world.ctx.device))  # the kept hooks, re-armed
        after = drive.denoise(executor, plain, JobTimer(world.ctx.device))  # passing through
        assert dict(CLOCK.counts) == compiles  # no compile after the first job
    assert sum(skipped) > 0 and sum(counters["graph_break"].values()) > 0  # the hooked calls run eagerly
    assert (compiled - eager).abs().max().item() <= 1e-4
    assert torch.equal(again, compiled)
    assert (after - eager_plain).abs().max().item() <= 1e-4


def test_gen_run_takes_taylorseer_with_compile(tmp_path):
    url = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "num_inference_steps": 5}])
    result = run_cli("run", url, "--out", str(tmp_path / "out"), "--model", "tiny-wan", "--compile",
                     "--compile-backend", "aot_eager", "--cache", "taylorseer:2", "-q")
    assert result.returncode == 0, result.stderr
