"""A batch of rows equals diffusers' batched call with a list of generators, and each row equals itself alone,
within fp32 rounding (a batched GEMM sums in another order than a batch of one). Qwen-Image's prompts have
lengths of their own: its batch pads and masks the shorter ones, as the pipeline does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor

ROUNDING = 2e-4
"""The most a [0, 1] pixel of a batched row may differ from the same row computed otherwise (fp32 rounding;
a wrong prompt, seed or position in the batch moves pixels by 1e-2 and more)."""
PROMPTS = ("a red fox running through snow", "a lighthouse at dusk", "two cats on a sofa", "a bowl of ramen")
NEGATIVES = ("blurry", "low quality, watermark", "text", "cartoon")


def _rows(preset: str, cfg: bool) -> list:
    base = job(preset, num_inference_steps=3, guidance_scale=4.5 if cfg else job(preset).guidance_scale)
    return [replace(base, id=f"row{index}", prompt=prompt, seed=100 + index,
                    negative_prompt=NEGATIVES[index] if cfg else None, row=index)
            for index, prompt in enumerate(PROMPTS)]


def _pipeline_batch(preset: str, rows) -> np.ndarray:
    pipe = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32)
    first = rows[0]
    call = dict(prompt=[row.prompt for row in rows], height=first.height, width=first.width,
                num_inference_steps=first.num_inference_steps, guidance_scale=first.guidance_scale,
                generator=[torch.Generator("cpu").manual_seed(row.seed) for row in rows], output_type="np")
    if first.negative_prompt is not None:
        call["negative_prompt"] = [row.negative_prompt for row in rows]
    if preset == "tiny-qwen-image":  # the manifest's guidance_scale is true CFG's scale
        call["true_cfg_scale"] = call.pop("guidance_scale")
    return pipe(**call).images


@pytest.mark.parametrize(("preset", "cfg"), [("tiny-flux", False), ("tiny-sd3", True), ("tiny-qwen-image", True)])
def test_a_batch_equals_the_pipelines_batched_call_and_each_row_alone(preset, cfg, tmp_path):
    rows = _rows(preset, cfg)
    with job_executor(str(tmp_path / "out"), model=preset) as (world, executor):
        batched = drive.generate_batch(executor, rows, JobTimer(world.ctx.device))
        alone = [drive.generate(executor, row, JobTimer(world.ctx.device)) for row in rows]
    theirs = _pipeline_batch(preset, rows)
    assert len(batched) == len(rows)
    for index, row in enumerate(rows):
        np.testing.assert_allclose(batched[index], theirs[index], rtol=0, atol=ROUNDING, err_msg=row.id)
        np.testing.assert_allclose(batched[index], alone[index], rtol=0, atol=ROUNDING, err_msg=row.id)
    # the rows differ from each other (their own prompts and seeds reached their own places in the batch)
    assert min(np.abs(batched[0] - other).max() for other in batched[1:]) > 1e-2
