"""Bytes each rank sends per denoising step, counted by the code itself, against seed 000's formulas (5%).

Per step and rank, for N tokens of width d (= heads x head_dim), e bytes per value, L attention layers and
F transformer forwards per step on this rank (2 with CFG unless CFG-parallel):
    Ulysses  4 (p-1)/p^2 N d e  per layer          (all-to-all of q, k, v and the output)
    Ring     2 (p-1)/p   N d e  per layer          (K and V around the ring)
    CFG      one exchange of the prediction        (its bytes, once, to the other branch)
(The all-gather of the output sequence at the end of each sequence-parallel forward, `sp_gather`, is not in
the seed's table and is counted apart.)
    FSDP     one all-gather of the weights per forward: (p-1)/p of the transformer's parameter bytes
"""

from __future__ import annotations

import pytest

from genbatch.models import resolve_model
from genbatch.parallel.fsdp import parameter_bytes
from genbatch.runner.presets import build_preset
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 2
WAN = job("tiny-wan", width=64, height=48, num_inference_steps=STEPS, seed=3)  # 3 x 3 x 4 = 36 tokens
SPEC = resolve_model("tiny-wan")
N, D, E, LAYERS = SPEC.tokens(64, 48, 9), SPEC.hidden_size, 4, SPEC.num_layers
LATENT_BYTES = 16 * 3 * 6 * 8 * E  # the noise prediction: 16 channels x 3 x 6 x 8


def _step_bytes(cfg, ring, ulysses, fsdp, out):
    with job_executor(out, cfg=cfg, ring=ring, ulysses=ulysses, fsdp=fsdp) as (world, executor):
        timer = JobTimer(world.ctx.device)
        drive.denoise(executor, WAN, timer)
        shard = parameter_bytes(executor.pipelines.get(SPEC).transformer)
        rows = [row for row in timer.rows() if row["stage"] == "denoise_step"]
        return [{k: v for k, v in row.items() if k.startswith("bytes_")} for row in rows], shard


# (cfg, ring, ulysses, fsdp) measured on two and on four ranks (dp takes the rest), one launch per world size
LAYOUTS = {
    2: [(1, 1, 2, False), (1, 2, 1, False), (2, 1, 1, False), (1, 1, 2, True), (2, 1, 1, True)],
    4: [(1, 1, 4, False), (1, 2, 2, False)],
}


def _all_layouts(rank, world_size, out):
    return {layout: _step_bytes(*layout, out=f"{out}/{index}") for index, layout in enumerate(LAYOUTS[world_size])}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """{(cfg, ring, ulysses, fsdp): [per rank: (step byte counts, transformer shard bytes)]}"""
    results = {}
    for world_size in LAYOUTS:
        out = str(tmp_path_factory.mktemp(f"bytes{world_size}"))
        per_rank = run_on_ranks(_all_layouts, world_size, args=(out,), timeout_s=60)
        for layout in LAYOUTS[world_size]:
            group = layout[0] * layout[1] * layout[2]
            results[layout] = [ranks[layout] for ranks in per_rank][:group]  # the first job group
    return results


def _check(per_rank, kind, expected):
    for rank, (steps, _) in enumerate(per_rank):
        assert len(steps) == STEPS
        for step, counts in enumerate(steps):
            measured = counts.get(f"bytes_{kind}", 0)
            assert abs(measured / expected - 1) <= 0.05, (
                f"rank {rank} step {step}: {kind} sent {measured} bytes, formula {expected:.0f}"
            )


@pytest.mark.parametrize("p", [2, 4])
def test_ulysses_bytes(p, measured):
    forwards = 2  # cond and uncond on every rank
    _check(measured[(1, 1, p, False)], "all_to_all", forwards * LAYERS * 4 * (p - 1) / p**2 * N * D * E)


def test_ring_bytes(measured):
    p, forwards = 2, 2
    _check(measured[(1, p, 1, False)], "p2p", forwards * LAYERS * 2 * (p - 1) / p * N * D * E)


def test_usp_bytes(measured):
    u = r = 2
    per_rank = measured[(1, r, u, False)]
    # Ulysses on its group over the ring row's N/R tokens; Ring on its group over h/U heads
    _check(per_rank, "all_to_all", 2 * LAYERS * 4 * (u - 1) / u**2 * (N / r) * D * E)
    _check(per_rank, "p2p", 2 * LAYERS * 2 * (r - 1) / r * N * (D / u) * E)


def test_cfg_bytes_one_prediction_exchange(measured):
    _check(measured[(2, 1, 1, False)], "cfg_exchange", LATENT_BYTES)


def test_fsdp_bytes_one_all_gather_of_the_weights(measured):
    p = 2
    per_rank = measured[(1, 1, p, True)]
    total = sum(shard for _, shard in per_rank)  # the transformer's parameter bytes, summed over shards
    forwards = 2
    _check(per_rank, "fsdp_all_gather", forwards * (p - 1) / p * total)


def test_fsdp_parameter_memory_falls_to_one_over_p(measured):
    shards = [shard for _, shard in measured[(2, 1, 1, True)]]
    unsharded = sum(p.numel() * 4 for p in build_preset("tiny-wan").transformer.parameters())
    assert sum(shards) == unsharded  # the shards add up to the whole model, nothing duplicated
    for shard in shards:
        assert shard <= 1.05 * unsharded / len(shards)
