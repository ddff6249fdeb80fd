"""One token-count derivation: `token_count` of `latent_shape` equals the tokens each tiny model's first
block actually sees (sizes off the size multiple included, where rounding up and down differ), and the cost
estimate, the spec and the planner's shape all give that same count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genbatch.jobs.cost import estimated_flops, estimated_flops_array
from genbatch.models import family, resolve_model
from genbatch.planner.shapes import resolve_shape
from genbatch.runner.loading import load_pipeline
from tests.support.runs import job

CASES = [
    ("tiny-wan", 64, 48, 9),
    ("tiny-wan", 72, 40, 13),  # latent 9 x 5: a half patch on each axis (ceil would count 5 x 3)
    ("tiny-flux", 64, 64, None),
    ("tiny-flux", 72, 88, None),  # latent 9 x 11
    ("tiny-sd3", 64, 48, None),
    ("tiny-sd3", 72, 56, None),  # latent 9 x 7
]


class _Seen(Exception):
    pass


def _tokens_seen(pipe, plan, spec_job) -> int:
    """Tokens of the image stream entering the transformer's first repeated block, in a real forward."""
    hooks = family(resolve_model(spec_job.model).family).hooks
    first = pipe.transformer.get_submodule(plan.blocks.repeated[0])[0]

    def stop(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        raise _Seen(hidden.shape[1])  # (b, tokens, d)

    handle = first.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad():
            conditioning = hooks.encode(pipe, spec_job, torch.device("cpu"))
            trajectory = hooks.trajectory(pipe, spec_job, torch.Generator("cpu").manual_seed(0), torch.device("cpu"))
            hooks.predict(pipe, trajectory, trajectory.latents, trajectory.timesteps[0], 0,
                          conditioning.branches["cond"])
    except _Seen as seen:
        return seen.args[0]
    finally:
        handle.remove()
    raise AssertionError("the first block never ran")


@pytest.fixture(scope="module")
def pipelines():
    return {name: load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32)
            for name in {case[0] for case in CASES}}


@pytest.mark.parametrize("preset,width,height,frames", CASES)
def test_the_token_count_is_what_the_model_sees(pipelines, preset, width, height, frames):
    spec = resolve_model(preset)
    plan = family(spec.family).transformer_parts(type(pipelines[preset].transformer).__name__)
    spec_job = job(preset, width=width, height=height, num_frames=frames, num_inference_steps=2)
    seen = _tokens_seen(pipelines[preset], plan, spec_job)
    assert spec.tokens(width, height, frames) == seen
    assert resolve_shape(spec).image_tokens(width, height, frames) == seen


def test_the_cost_estimate_counts_the_same_tokens_for_one_job_and_for_columns():
    spec = resolve_model("tiny-wan")
    sizes = [(64, 48, 9, 5.0), (72, 40, 13, 5.0), (160, 96, 17, 1.0)]
    width, height, frames, guidance = (np.array(column) for column in zip(*sizes))
    columns = estimated_flops_array(spec, width, height, frames, np.full(3, 4), guidance)
    for (w, h, f, g), value in zip(sizes, columns):
        assert estimated_flops(job("tiny-wan", width=w, height=h, num_frames=f, guidance_scale=g), spec) == value
    n = 4 * (40 // 8 // 2) * (72 // 8 // 2)  # 13 frames -> 4 latent frames; 5 x 9 latent -> 2 x 4 patches
    d = spec.hidden_size
    assert columns[1] == (24.0 * n * d * d + 4.0 * n * n * d) * spec.num_layers * 2 * 4  # 2 branches, 4 steps


def test_a_true_cfg_row_without_negative_prompt_costs_one_branch():
    """Qwen-Image runs its second branch only for rows with a negative prompt; the cost estimate agrees,
    row by row and column-wise."""
    spec = resolve_model("tiny-qwen-image")
    with_negative = job("tiny-qwen-image", negative_prompt="blurry", guidance_scale=4.0)
    without = job("tiny-qwen-image", negative_prompt=None, guidance_scale=4.0)
    assert estimated_flops(with_negative, spec) == 2 * estimated_flops(without, spec)
    columns = estimated_flops_array(spec, np.full(2, 64), np.full(2, 64), np.ones(2), np.full(2, 4),
                                    np.full(2, 4.0), np.array([True, False]))
    assert columns[0] == 2 * columns[1]
    wan = resolve_model("tiny-wan")  # plain CFG: the unconditional branch runs with or without one
    assert estimated_flops(job("tiny-wan", negative_prompt=None, guidance_scale=5.0), wan) == estimated_flops(
        job("tiny-wan", negative_prompt="grey", guidance_scale=5.0), wan)
