"""Enumeration, placement and legality of layouts; the objectives and `best_layout`."""

from __future__ import annotations

import pytest

from genbatch.planner import best_layout, plan
from genbatch.planner.hardware import make_cluster
from genbatch.parallel.axes import AXES
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.layouts import axis_link, enumerate_layouts


@pytest.mark.parametrize("gpus", [1, 2, 6, 8, 16])
def test_every_layout_multiplies_to_the_gpus_and_none_repeats(gpus):
    layouts = enumerate_layouts(gpus)
    assert len(set(layouts)) == len(layouts)
    for layout in layouts:
        assert layout.world_size == gpus and layout.cfg in (1, 2) and layout.fsdp_size in (1, layout.group_size // (layout.tp * layout.pp))
        assert not layout.fsdp or (layout.fsdp_size > 1 and layout.distrifusion == 1)
        assert not layout.problems()
    plain = {layout for layout in layouts if not layout.fsdp}
    assert ParallelDims(dp=gpus) in plain and ParallelDims(ulysses=gpus) in plain and ParallelDims(ring=gpus) in plain


def test_ranked_and_rejected_cover_every_layout_once():
    result = plan("wan2.1-14b", 16, nodes=2, gpu="a100")
    seen = [candidate.layout for candidate in result.ranked] + [rejection.layout for rejection in result.rejected]
    assert sorted(seen, key=repr) == sorted(enumerate_layouts(16), key=repr)
    assert all(rejection.reasons for rejection in result.rejected)


def test_mesh_order_puts_ulysses_innermost_and_dp_outermost():
    layout = ParallelDims(dp=2, cfg=2, ring=2, ulysses=2)
    assert [layout.span(axis)[0] for axis in AXES] == [8, 4, 4, 4, 2, 1, 1]


def test_links_per_axis_on_two_nodes():
    cluster = make_cluster(16, nodes=2, gpu="h100", interconnect="ethernet")
    layout = ParallelDims(ring=2, ulysses=8)
    assert axis_link(layout, "ulysses", cluster).name == "nvlink"
    assert axis_link(layout, "ring", cluster).name == "ethernet"
    assert axis_link(ParallelDims(dp=2, ring=2, ulysses=4), "ring", cluster).name == "nvlink"


def test_pcie_groups_beyond_a_socket_use_the_slow_bridge():
    cluster = make_cluster(8, gpu="l40")
    assert axis_link(ParallelDims(dp=2, ulysses=4), "ulysses", cluster).name == "pcie"
    assert axis_link(ParallelDims(ulysses=8), "ulysses", cluster).name == "pcie-cross-socket"


def test_rejection_reasons_name_the_limit():
    reasons = {rejection.layout: rejection.reasons for rejection in plan("flux.1-dev", 16).rejected}
    assert "does not divide the 24 heads" in reasons[ParallelDims(ulysses=16)][0]
    assert "classifier-free guidance" in reasons[ParallelDims(dp=8, cfg=2)][0]
    tiny = {r.layout: r.reasons for r in plan("tiny-flux", 4, steps=20).rejected}
    assert "exceeds the 2 layers" in tiny[ParallelDims(pp=4)][0]
    big = {r.layout: r for r in plan("wan2.1-14b", 8, gpu_mem=40).rejected}
    one = big[ParallelDims(dp=8)]
    assert "GiB per rank > 40.00 GiB" in one.reasons[0] and f"fits with {one.fix.change}" in one.reasons[0]
    assert one.over.needs_gib > 40 and one.fix.memory_gib <= 40


def test_pp_and_tp_are_ranked_with_and_without_fsdp():
    layouts = set(enumerate_layouts(8))
    for layout in (ParallelDims(ulysses=8), ParallelDims(pp=2, ulysses=4), ParallelDims(tp=2, dp=4),
                   ParallelDims(pp=2, ulysses=4, fsdp=True), ParallelDims(tp=2, ulysses=2, dp=2, fsdp=True)):
        assert layout in layouts and not layout.problems()


def test_throughput_splits_only_for_memory():
    # Wan 14B 1080p 201 frames: one rank cannot hold weights, encoders and 47 GiB of activations, so jobs are
    # split, but no more than needed
    result = plan("wan2.1-14b", 8, width=1920, height=1080, frames=201)
    best = result.best.layout
    fits = [candidate.layout.dp for candidate in result.ranked]
    assert best.dp == max(fits) < 8
    # a bigger card holds them: fewer ranks per job
    assert plan("wan2.1-14b", 8, width=1920, height=1080, frames=201, gpu="b200").best.layout.dp > best.dp


def test_throughput_splits_for_max_latency():
    free = plan("flux.1-dev", 8).best
    assert free.layout == ParallelDims(dp=8)
    bounded = plan("flux.1-dev", 8, max_latency=2.0).best
    assert bounded.estimate.seconds_per_job <= 2.0 and bounded.layout.dp == 2
    reasons = [reason for r in plan("flux.1-dev", 8, max_latency=2.0).rejected for reason in r.reasons]
    assert any("--max-latency 2 s" in reason for reason in reasons)


def test_latency_objective_minimises_seconds_per_job():
    result = plan("hunyuanvideo", 8, objective="latency")
    exact = [candidate for candidate in result.ranked if candidate.layout.pp == 1]
    assert [c.estimate.seconds_per_job for c in exact] == sorted(c.estimate.seconds_per_job for c in exact)


def test_best_layout_returns_degrees_for_the_runner():
    degrees = best_layout("wan2.1-14b", 8, objective="latency")
    assert degrees == {"dp": 1, "cfg": 2, "distrifusion": 1, "pp": 1, "ring": 1, "ulysses": 4, "tp": 1, "fsdp": 1,
                       "vae_parallel": 8}
    assert best_layout("tiny-wan", 4)["dp"] == 4


def test_nothing_fits_names_the_way_out():
    with pytest.raises(ValueError, match="no runnable layout.*GiB per rank.*use more GPUs"):
        best_layout("wan2.1-14b", 1, gpu_mem=24)  # at 40 GiB fp8 weights fit: tests/planner/test_quantization.py
    with pytest.raises(ValueError, match="max-latency"):
        best_layout("flux.1-dev", 2, max_latency=0.5)


def test_bad_inputs_are_value_errors_naming_the_fix():
    with pytest.raises(ValueError, match="choose throughput or latency"):
        plan("flux.1-dev", 8, objective="fastest")
    with pytest.raises(ValueError, match="--max-latency"):
        plan("flux.1-dev", 8, max_latency=0)
    with pytest.raises(ValueError, match="--frames 9 applies to video models"):
        plan("flux.1-dev", 8, frames=9)
    with pytest.raises(ValueError, match="--width 0"):
        plan("flux.1-dev", 8, width=0)


def test_the_best_layout_is_one_the_runner_accepts():
    dims = plan("wan2.1-14b", 8, objective="latency").best.layout
    assert dims == ParallelDims(cfg=2, ulysses=4)
    dims.validate(world_size=8, num_heads=40, uses_cfg=True)
    assert ParallelDims(ulysses=4, fsdp=True).fsdp_size == 4  # the planner's fsdp degree is the runner's
    assert ParallelDims(pp=2) in enumerate_layouts(2)  # PipeFusion's patch pipeline runs as estimated


def test_a_few_step_recipe_is_priced_at_its_own_steps_and_one_branch():
    full = plan("wan2.1-14b", 8, objective="latency")
    fast = plan("wan2.1-14b", 8, objective="latency", steps=4, guidance=1.0)
    assert full.best.layout.cfg == 2 and fast.best.layout.cfg == 1  # no branch to split: the ranks go to ulysses
    assert all(candidate.layout.cfg == 1 for candidate in fast.ranked)
    same = plan("wan2.1-14b", 8, objective="latency", steps=4, guidance=5.0)
    denoise = {name: result.best.estimate.seconds_per_job - result.best.estimate.decode_s
               for name, result in (("fast", fast), ("same", same), ("full", full))}
    assert 0.4 < denoise["fast"] / denoise["same"] < 0.6  # one forward a step instead of two, on the same 8 ranks
    assert denoise["same"] < denoise["full"] * 4 / 50 * 1.05  # the model's 50 steps against the row's 4
    assert best_layout("wan2.1-14b", 8, objective="latency", steps=4, guidance=1.0)["cfg"] == 1
