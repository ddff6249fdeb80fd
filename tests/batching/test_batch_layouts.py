"""A batch of four rows under ulysses 2, cfg 2, tp 2 and --fsdp equals one process's batch of four (gloo,
fp32): latents within 1e-5, frames within 1e-4, as `tests/parallel/test_layouts.py` holds single rows. SD3 at
80x48 has 15 image tokens, which do not divide by 2: the batch's sequence split is uneven, as a row's is."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

BASE = job("tiny-sd3", width=80, height=48, num_inference_steps=3, guidance_scale=4.5)
ROWS = [replace(BASE, id=f"row{index}", prompt=prompt, negative_prompt=negative, seed=40 + index, row=index)
        for index, (prompt, negative) in enumerate([("a red boat", "grey"), ("a green field at noon", "blurry"),
                                                    ("a city at night", "text"), ("an owl", "low quality")])]
# (dp, cfg, ulysses, tp, fsdp) on four ranks
LAYOUTS = [(2, 1, 2, 1, False), (2, 2, 1, 1, False), (2, 1, 1, 2, False), (2, 1, 2, 1, True)]


def _batch(out: str, **layout):
    with job_executor(out, **layout) as (world, executor):
        timer = JobTimer(world.ctx.device)
        latents = drive.denoise_batch(executor, ROWS, timer)
        return latents, drive.decode_batch(executor, ROWS, latents, timer)


def _every_layout(rank, world_size, out):
    return [_batch(f"{out}/{index}", dp=dp, cfg=cfg, ulysses=ulysses, tp=tp, fsdp=fsdp)
            for index, (dp, cfg, ulysses, tp, fsdp) in enumerate(LAYOUTS)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _batch(str(tmp_path_factory.mktemp("reference")))


def test_batched_layouts_equal_one_process(reference, tmp_path):
    ref_latents, ref_frames = reference
    assert ref_latents.shape[0] == len(ROWS)
    per_rank = run_on_ranks(_every_layout, 4, args=(str(tmp_path),), timeout_s=90)
    for index, layout in enumerate(LAYOUTS):
        leaders = 0
        for rank, results in enumerate(per_rank):
            latents, frames = results[index]
            diff = (latents - ref_latents).abs().max().item()
            assert diff <= 1e-5, f"{layout}: rank {rank} latents differ by {diff}"
            if frames[0] is not None:
                leaders += 1
                for row, (ours, theirs) in enumerate(zip(frames, ref_frames, strict=True)):
                    assert np.abs(ours - theirs).max() <= 1e-4, f"{layout}: rank {rank} row {row} frames differ"
        assert leaders == 2, f"{layout}: one leader per group decodes"
