"""The planner's transformer FLOPs and weight bytes against the ones counted on the published transformers
(`bench/transformer_costs.py`: each built from its published config on the meta device, one forward at the
planner's default workload under torch's FLOP counter): the 2026 families within 25%."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("transformer_costs", os.path.join(REPO, "bench",
                                                                                    "transformer_costs.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
FAST = ("flux.2-klein", "qwen-image-2.1")
"""A few seconds together: FLUX.2's blocks, and the block-causal transformer whose forward reads its index tensors'
values and whose later steps run against its kept keys and values. The others are slow (`make test-slow`)."""
SLOW = ("flux.2-dev", "z-image-turbo", "hunyuanvideo-1.5-720p", "ltx-2")


@pytest.mark.parametrize("name", [*FAST, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW)])
def test_new_transformers_are_priced_within_a_quarter_of_their_counts(name):
    result = BENCH.count(name)
    assert result.counted_flops > 0 and result.counted_bytes > 0
    assert abs(result.flops_ratio - 1) <= BENCH.WITHIN, BENCH.line(result)
    assert abs(result.bytes_ratio - 1) <= BENCH.WITHIN, BENCH.line(result)
    assert result.within, BENCH.line(result)  # and the kept keys and values of a model that keeps them
    assert bool(result.counted_kept) == (name == "qwen-image-2.1")


@pytest.mark.slow
def test_qwen_image_21_later_steps_run_the_outputs_tokens_alone():
    # the prefix's keys and values kept: a step's average is far below a whole forward over the sequence (the
    # planner priced the whole forward at every step before it knew)
    _, config = BENCH.published_models()["qwen-image-2.1"]
    _, grid = BENCH.workload_grid("qwen-image-2.1")
    model = BENCH.build("QwenImage21Transformer2DModel", config)
    (_, extract), (_, cached) = forwards = BENCH.INPUTS["QwenImage21Transformer2DModel"](config, grid)
    assert (extract["kv_cache_mode"], cached["kv_cache_mode"]) == ("extract", "cached")
    step = BENCH.count_forward(model, forwards)
    whole = BENCH.count_forward(model, [(1.0, {**extract, "kv_cache": None, "kv_cache_mode": None})])
    assert step < 0.6 * whole


def test_the_check_fails_when_the_planner_is_off(monkeypatch, capsys):
    from genbatch.planner import cost

    real = cost.forward_flops
    monkeypatch.setattr(cost, "forward_flops", lambda work: 0.6 * real(work))
    assert BENCH.main(["--models", "flux.2-klein"]) == 1
    assert "OUTSIDE 25%" in capsys.readouterr().out


def test_shadow_values_answer_the_reads_meta_tensors_cannot():
    mask = BENCH.shadowed(torch.tensor([True, False, True, True]))
    values = torch.empty(1, 4, 8, device="meta")
    with BENCH.ShadowValues():
        picked = values[:, mask]
        count = int(mask.sum())
        ids = torch.full_like(mask, -1, dtype=torch.long)
        ids[mask] = torch.tensor([7, 8, 9], device="meta")
        listed = ids.tolist()
    assert picked.shape == (1, 3, 8) and picked.device.type == "meta"
    assert count == 3 and listed == [7, -1, 8, 9]


def test_the_planners_memory_holds_the_kept_keys_and_values():
    from dataclasses import replace

    from genbatch.parallel.dims import ParallelDims
    from genbatch.planner.hardware import GIB
    from genbatch.planner.memory import kept_prefix_bytes, memory_per_rank

    work, _ = BENCH.workload_grid("qwen-image-2.1")
    forgetful = replace(work, shape=replace(work.shape, keeps_prefix_kv=False))
    for layout in (ParallelDims(), ParallelDims(tp=2)):
        kept = kept_prefix_bytes(layout, work)
        added = memory_per_rank(layout, work)["activations"] - memory_per_rank(layout, forgetful)["activations"]
        assert kept > 0 and added == pytest.approx(kept / GIB)
    assert kept_prefix_bytes(ParallelDims(tp=2), work) == kept_prefix_bytes(ParallelDims(), work) / 2
    assert kept_prefix_bytes(ParallelDims(), BENCH.workload_grid("flux.2-klein")[0]) == 0
