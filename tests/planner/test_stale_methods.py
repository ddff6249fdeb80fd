"""The stale-K/V methods in the planner: DistriFusion's layouts, step time, memory and fit; PipeFusion's job time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genbatch.parallel.dims import ParallelDims
from genbatch.planner import plan
from genbatch.planner.constraints import LayoutConstraints
from genbatch.planner.cost import estimate, step_terms
from genbatch.planner.hardware import GIB, make_cluster
from genbatch.planner.layouts import enumerate_layouts, structural_problems
from genbatch.planner.rank import STALE_MARGIN, Candidate, rank_key
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.stale_fit import stale_kv_bytes
from genbatch.planner.stale_time import DISTRIFUSION_WARMUP_STEPS, pipefusion_job_seconds
from genbatch.planner.workload import make_workload


def _cost(model: str, layout: ParallelDims, gpus: int = 8, steps: int | None = None, **cluster):
    work = make_workload(resolve_shape(model), steps=steps)
    return work, estimate(layout, work, make_cluster(gpus, **cluster))


def test_pipefusion_job_time_formula_gives_xdit_speedups():
    # W T + (S - W) T / P + (P - 1) T / (P M); S = 50, P = M = 4: W = 1 -> 3.72x, W = 4 -> 3.19x over one device
    one_device = 50 * 1.0
    for warmup, speedup in ((1, 3.72), (4, 3.19)):
        job = pipefusion_job_seconds(warm_step_s=1.0, step_s=1.0 / 4, steps=50, stages=4, patches=4, warmup=warmup)
        assert one_device / job == pytest.approx(speedup, abs=0.005)
    # all steps synchronous: no asynchronous step, so no bubble either
    assert pipefusion_job_seconds(warm_step_s=1.0, step_s=0.25, steps=1, stages=4, patches=4) == 1.0


def test_pipefusion_estimate_fills_the_pipeline_once_a_job():
    _, short = _cost("sd3-medium", ParallelDims(cfg=2, pp=4), gpu="l40", steps=20)
    _, long = _cost("sd3-medium", ParallelDims(cfg=2, pp=4), gpu="l40", steps=30)
    assert long.seconds_per_step == pytest.approx(short.seconds_per_step)
    # ten more steps cost ten asynchronous steps: warm-up and bubble are paid once per job
    assert long.seconds_per_job - short.seconds_per_job == pytest.approx(10 * short.seconds_per_step)
    assert long.pipeline_s == pytest.approx(short.pipeline_s) and short.pipeline_s > 3 / 4 * short.seconds_per_step


def test_distrifusion_layouts_combine_with_cfg_and_dp_only():
    stale = [layout for layout in enumerate_layouts(8) if layout.distrifusion > 1]
    assert {(layout.dp, layout.cfg, layout.distrifusion) for layout in stale} == {
        (4, 1, 2), (2, 1, 4), (1, 1, 8), (2, 2, 2), (1, 2, 4)}
    assert all(layout.sp == layout.pp == layout.tp == 1 and not layout.fsdp for layout in stale)
    shape, cluster = resolve_shape("flux.1-dev"), make_cluster(8)
    assert "does not compose with --ulysses 2" in structural_problems(
        ParallelDims(distrifusion=2, ulysses=2), shape, 4096, 28, cluster)[0]
    assert "distrifusion (DistriFusion) reuses the previous step's K/V; 4 steps are too few" in structural_problems(
        ParallelDims(distrifusion=2), shape, 4096, 4, cluster)[0]
    assert structural_problems(ParallelDims(distrifusion=8), shape, 4, 28, cluster) == [
        "8 sequence shards exceed the 4 tokens"]
    # `gen plan --distrifusion 2 --ulysses 2`: the runner's reason, and the nearest flags that fit
    with pytest.raises(ValueError, match=r"does not compose with --ulysses 2.*nearest that fit: --distrifusion 1 "):
        plan("flux.1-dev", 8, constraints=LayoutConstraints(distrifusion=2, ulysses=2))
    ranked = plan("flux.1-dev", 8, constraints=LayoutConstraints(distrifusion=4)).ranked
    assert [candidate.layout for candidate in ranked] == [ParallelDims(dp=2, distrifusion=4)]


def test_distrifusion_step_splits_the_work_and_gathers_each_layers_kv():
    work, cost = _cost("flux.1-dev", ParallelDims(distrifusion=4), gpus=4)
    cluster = make_cluster(4)
    one, four = step_terms(ParallelDims(), work, cluster), step_terms(ParallelDims(distrifusion=4), work, cluster)
    # linear work / P; each rank's N/P queries against all N keys: attention / P
    assert four.linear_flops == pytest.approx(one.linear_flops / 4)
    assert four.attention_flops == pytest.approx(one.attention_flops / 4)
    n, d, layers = work.sequence, work.shape.hidden_size, work.shape.num_layers
    assert cost.comm_bytes["distrifusion"] == pytest.approx(2 * n / 4 * d * 3 * 2 * layers)  # bf16, per layer
    assert cost.comm_bytes["sp_gather"] == pytest.approx(3 / 4 * work.prediction_bytes)
    # NVLink: the gathers hide under compute in asynchronous steps; the 4 synchronous warm-up steps wait for them
    assert 0 < cost.comm_exposed_s < cost.comm_s
    assert 0 < cost.pipeline_s <= DISTRIFUSION_WARMUP_STEPS * cost.comm_s
    assert cost.seconds_per_job == pytest.approx(work.steps * cost.seconds_per_step + cost.pipeline_s + cost.decode_s)


def test_distrifusion_memory_is_the_whole_weights_and_every_layers_kv():
    layouts = (("flux.1-dev", ParallelDims(distrifusion=4)), ("wan2.1-1.3b", ParallelDims(cfg=2, distrifusion=2)),
               ("wan2.1-1.3b", ParallelDims(distrifusion=4)))
    for model, layout in layouts:
        work, cost = _cost(model, layout, gpus=4)
        _, single = _cost(model, ParallelDims(), gpus=4)
        kv = stale_kv_bytes(work.shape, work.width, work.height, work.frames, layout) / GIB
        assert cost.memory["weights"] == pytest.approx(single.memory["weights"])  # every layer on every rank
        assert cost.memory["stale_kv"] == pytest.approx(kv) and kv > 0
        activations = single.memory["activations"] / layout.distrifusion + kv
        assert cost.memory["activations"] == pytest.approx(activations)
    # PipeFusion: 2 x N x d x L/P per CFG branch the stage runs
    work, both = _cost("wan2.1-1.3b", ParallelDims(pp=4), gpus=4)
    _, one = _cost("wan2.1-1.3b", ParallelDims(cfg=2, pp=2), gpus=4)
    n, d, layers = work.sequence, work.shape.hidden_size, work.shape.num_layers
    assert both.memory["stale_kv"] * GIB == pytest.approx(2 * (2 * n * d * layers / 4) * 2)  # bf16, two branches
    assert one.memory["stale_kv"] * GIB == pytest.approx(2 * n * d * layers / 2 * 2)
    # FLUX.1-dev 1024^2: 2 x 4,608 tokens x 3,072 x 57 layers in bf16 = 3.2 GB beside 24 GB of weights
    flux = resolve_shape("flux.1-dev")
    assert stale_kv_bytes(flux, 1024, 1024, None, ParallelDims(distrifusion=4)) / 1e9 == pytest.approx(3.2, abs=0.05)


def test_wan_14b_720p_kv_cannot_fit_an_80_gb_gpu_and_flux_fits():
    wan = plan("wan2.1-14b", 8, gpu="a100", objective="latency")  # 80 GB a GPU; 1280x720, 81 frames
    assert not [candidate for candidate in wan.ranked if candidate.layout.distrifusion > 1]
    stale = [rejection for rejection in wan.rejected if rejection.layout.distrifusion > 1]
    assert len(stale) == 5
    for rejection in stale:
        branches = 2 // rejection.layout.cfg
        assert any(f"61.9 GB per CFG branch x {branches}" in reason and "28.6 GB of weights" in reason
                   for reason in rejection.reasons)
    flux = plan("flux.1-dev", 8, objective="latency")
    ranked = {candidate.layout for candidate in flux.ranked}
    assert {ParallelDims(distrifusion=8), ParallelDims(dp=2, distrifusion=4)} <= ranked


def test_distrifusion_ranks_below_an_exact_layout_of_equal_time():
    _, cost = _cost("flux.1-dev", ParallelDims(ulysses=4), gpus=4)
    exact = Candidate(layout=ParallelDims(ulysses=4), estimate=cost, jobs_per_hour=100.0)
    for objective in ("latency", "throughput"):
        stale = Candidate(layout=ParallelDims(distrifusion=4), estimate=cost, jobs_per_hour=100.0)
        assert rank_key(exact, objective) < rank_key(stale, objective)
    faster = cost.seconds_per_job / (1 + STALE_MARGIN) * 0.99
    for speed, wins in ((faster, True), (cost.seconds_per_job * 0.95, False)):
        quicker = Candidate(layout=ParallelDims(distrifusion=4), jobs_per_hour=100.0,
                            estimate=replace(cost, seconds_per_job=speed))
        assert (rank_key(quicker, "latency") < rank_key(exact, "latency")) is wins

