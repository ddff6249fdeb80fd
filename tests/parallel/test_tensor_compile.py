"""`--compile` with tensor parallelism (aot_eager: dynamo and AOTAutograd tracing, what graph breaks and
recompiles depend on): the compiled denoiser gives the eager latents, with no graph break inside a block's
`forward` (the column-wise inputs wrapped as DTensors, the row-wise all-reduces and the modulation's gathers
through genbatch's counted collectives, Wan's head-split QK-norm reductions, all inside the graph) and one
graph per kind of block over every forward of the job (no recompile from step to step or between the CFG
branches)."""

from __future__ import annotations

import pytest

from tests.parallel.test_compile import _compare
from tests.support.distributed import run_on_ranks


def _tp_two(rank: int, world_size: int, out: str, presets: tuple[str, ...]) -> dict:
    return {preset: _compare(f"{out}/{rank}/{preset}", preset, tp=2) for preset in presets}


def _check(results_by_rank) -> None:
    for rank, results in enumerate(results_by_rank):
        for preset, result in results.items():
            assert result["diff"] <= 1e-4, (rank, preset, result["diff"])
            assert result["graph_breaks"] == 0, (rank, preset)
            assert result["graphs"] == sum(result["compiles"].values()) <= 2, (rank, preset, result["compiles"])


def test_compiled_wan_under_tp_2_has_no_graph_break_and_no_recompile(tmp_path):
    _check(run_on_ranks(_tp_two, world_size=2, args=(str(tmp_path), ("tiny-wan",)), timeout_s=240))


@pytest.mark.slow
def test_compiled_flux_and_sd3_under_tp_2_have_no_graph_break_and_no_recompile(tmp_path):
    _check(run_on_ranks(_tp_two, world_size=2, args=(str(tmp_path), ("tiny-flux", "tiny-sd3")), timeout_s=240))
