"""FSDP from a pipeline directory: ranks build the sharded components on the meta device from their configs,
the leader reads the weights, and the job's output equals a one-process run of the same directory (bf16
weights, as users run it)."""

from __future__ import annotations

import pytest
import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor


@pytest.fixture(scope="module")
def wan_directory(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan") / "model"
    load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32).save_pretrained(path)
    return str(path)


def _latents(rank, world_size, model, out, layout):
    spec_job = job("tiny-wan", model=model, num_inference_steps=3, seed=21, negative_prompt="fog")
    with job_executor(out, dtype="bf16", **layout) as (world, executor):
        return drive.denoise(executor, spec_job, JobTimer(world.ctx.device)).float()


def test_fsdp_loads_a_directory_and_matches_one_process(wan_directory, tmp_path):
    reference = _latents(0, 1, wan_directory, str(tmp_path / "one"), {})
    per_rank = run_on_ranks(_latents, 2, args=(wan_directory, str(tmp_path / "two"), {"ulysses": 2, "fsdp": True}),
                            timeout_s=60)
    for latents in per_rank:
        assert (latents - reference).abs().max().item() <= 2e-2  # bf16: a different reduction order
        assert torch.isfinite(latents).all()
