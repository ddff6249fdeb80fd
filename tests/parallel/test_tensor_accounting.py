"""Tensor parallelism's bytes per step per rank, counted by the code itself, against the per-model formula
(`genbatch.parallel.formulas`, within 5%), and its weights per rank.

    tp_all_reduce   A 2 (p-1)/p N d e per forward, A the model's all-reduces per block summed over the blocks
                    (Wan 3 a block; FLUX and HunyuanVideo 2 a dual-stream block and 1 a single-stream one;
                    SD3 2, its last block over the image alone); a joint block's N is text plus image
    tp_all_gather   the AdaLN modulation: this rank's (B, 6d/p) to each other rank, per modulation Linear
    tp_norm         Wan's QK norm across heads: (tokens, 1) fp32 sums of squares per norm call

Weights: with the AdaLN modulation split too, a tp 2 rank holds at most 0.55 of the one-rank weights of the
published Wan 2.1 (1.3B, 14B), FLUX.1-dev and Qwen-Image architectures (built on the meta device: shapes,
no memory).
"""

from __future__ import annotations

import pytest

from genbatch.models import family, resolve_model
from genbatch.parallel.formulas import StepShape, bytes_per_step, tp_all_reduce_tokens
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS, E, P = 2, 4, 2
JOBS = {
    "tiny-wan": job("tiny-wan", width=64, height=48, num_inference_steps=STEPS, seed=3),  # CFG: 2 forwards
    "tiny-flux": job("tiny-flux", width=64, height=48, num_inference_steps=STEPS, seed=3),
    "tiny-sd3": job("tiny-sd3", width=64, height=48, num_inference_steps=STEPS, seed=3),  # CFG: 2 forwards
    "tiny-hunyuan-video": job("tiny-hunyuan-video", width=64, height=48, num_inference_steps=STEPS, seed=3),
}
PUBLISHED = {  # (family, diffusers class, the published architecture's config; the rest: the class's defaults)
    "wan2.1-1.3b": ("wan", "WanTransformer3DModel", dict(num_attention_heads=12, ffn_dim=8960, num_layers=30)),
    "wan2.1-14b": ("wan", "WanTransformer3DModel", dict(num_attention_heads=40, ffn_dim=13824, num_layers=40)),
    "flux.1-dev": ("flux", "FluxTransformer2DModel", dict(guidance_embeds=True)),
    "qwen-image": ("qwen-image", "QwenImageTransformer2DModel", {}),
}


def _measure(rank, world_size, out):
    import diffusers
    import torch

    from genbatch.parallel.fsdp import parameter_bytes
    from genbatch.parallel.tensor.shard import tensor_parallel
    from genbatch.runner.timing import JobTimer

    found = {}
    for index, (name, spec_job) in enumerate(JOBS.items()):
        with job_executor(f"{out}/{index}", tp=P) as (world, executor):
            timer = JobTimer(world.ctx.device)
            drive.denoise(executor, spec_job, timer)
            rows = [row for row in timer.rows() if row["stage"] == "denoise_step"]
            found[name] = [{k: v for k, v in row.items() if k.startswith("bytes_")} for row in rows]
    ctx = world.ctx
    for name, (family_name, class_name, config) in PUBLISHED.items():
        cls = getattr(diffusers, class_name)
        with torch.device("meta"):
            model = cls(**config)
        whole = parameter_bytes(model)
        tensor_parallel(model, family(family_name).transformer_parts(class_name).tensor_splits, ctx.tp_comm, ctx.tp_mesh)
        found[name] = parameter_bytes(model) / whole
    return found


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return run_on_ranks(_measure, P, args=(str(tmp_path_factory.mktemp("tp")),), timeout_s=90)


def _blocks(name: str):
    from genbatch.runner.presets import build_preset

    model = build_preset(name).transformer
    plan = family(resolve_model(name).family).transformer_parts(type(model).__name__).tensor_splits
    return plan, {path: len(getattr(model, path)) for path in plan.all_reduces}


def _expected(name: str) -> float:
    spec = resolve_model(name)
    plan, blocks = _blocks(name)
    tokens = tp_all_reduce_tokens(plan, blocks, image_tokens=spec.tokens(64, 48, 9 if spec.is_video else None),
                                  text_tokens=spec.text_tokens, joint=spec.joint_text)
    shape = StepShape(tokens=0, width=spec.hidden_size, layers=spec.num_layers, parameters=0, prediction_values=0,
                      value_bytes=E, all_reduce_tokens=tokens)
    return bytes_per_step(shape, cfg=1, ring=1, ulysses=1, fsdp=False, uses_cfg=spec.uses_cfg, tp=P)["tp_all_reduce"]


@pytest.mark.parametrize("name", list(JOBS))
def test_tp_all_reduce_bytes_match_the_model_formula(name, measured):
    expected = _expected(name)
    for rank, results in enumerate(measured):
        assert len(results[name]) == STEPS
        for step, counts in enumerate(results[name]):
            got = counts.get("bytes_tp_all_reduce", 0)
            assert abs(got / expected - 1) <= 0.05, f"{name} rank {rank} step {step}: {got} bytes, formula {expected}"


def test_wan_counts_its_modulation_gather_and_qk_norm_reductions_apart(measured):
    spec = resolve_model("tiny-wan")
    d, n, text, forwards = spec.hidden_size, spec.tokens(64, 48, 9), spec.text_tokens, 2
    # one modulation Linear a forward: (1, 6d/p) to the other rank
    gather = forwards * 6 * d // P * E * (P - 1)
    # per block: attn1's q and k norms and attn2's q norm over the video tokens, attn2's k norm over the text
    norms = forwards * spec.num_layers * (3 * n + text) * E * 2 * (P - 1) // P
    for results in measured:
        for counts in results["tiny-wan"]:
            assert counts.get("bytes_tp_all_gather") == gather and counts.get("bytes_tp_norm") == norms


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_tp2_weights_per_rank_at_most_0_55_of_one_rank(name, measured):
    for results in measured:
        assert results[name] <= 0.55, f"{name}: a tp 2 rank holds {results[name]:.3f} of the weights"


def test_the_planner_prices_wan_at_the_all_reduces_gen_run_counts(measured):
    from genbatch.planner.shapes import resolve_shape

    spec, forwards = resolve_model("tiny-wan"), 2  # CFG: both branches on each tp rank
    one_all_reduce = 2 * (P - 1) / P * spec.tokens(64, 48, 9) * spec.hidden_size * E  # a ring all-reduce of [N, d]
    priced = resolve_shape("tiny-wan").tp_all_reduces
    assert priced == 3.0
    for results in measured:
        for counts in results["tiny-wan"]:
            counted = counts["bytes_tp_all_reduce"] / (forwards * spec.num_layers * one_all_reduce)
            assert abs(counted / priced - 1) <= 0.05, f"the run counts {counted:.3f} all-reduces a block"
