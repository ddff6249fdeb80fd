"""Decode memory as the decoders hold it (frame-causal, framewise, tiled, patch-parallel), the decode mode each
layout gets, and the published runs it used to reject."""

from __future__ import annotations

import pytest

from genbatch.parallel.dims import ParallelDims
from genbatch.planner import plan
from genbatch.planner.cost import estimate
from genbatch.planner.hardware import make_cluster
from genbatch.planner.memory import choose_decode, decode_modes, memory_per_rank
from genbatch.planner.shapes import resolve_shape
from genbatch.models.vae_costs import COGVIDEOX, HUNYUAN_VIDEO, IMAGE, WAN
from genbatch.planner.vae_memory import decode_peak_bytes
from genbatch.planner.workload import make_workload

GIB = 2**30


def _peak(memory, mode, width, height, frames, ranks=1) -> float:
    return decode_peak_bytes(memory, mode, width=width, height=height, frames=frames, ranks=ranks) / GIB


def test_frame_causal_and_framewise_decodes_hardly_grow_with_frames():
    # Wan decodes one latent frame at a time, HunyuanVideo 17 frames at a time: frames add only the output
    assert _peak(WAN, "full", 1280, 720, 161) < 1.1 * _peak(WAN, "full", 1280, 720, 81)
    assert _peak(HUNYUAN_VIDEO, "full", 1280, 720, 129) < 1.05 * _peak(HUNYUAN_VIDEO, "full", 1280, 720, 17)
    # an image VAE decodes the whole image: its peak grows with the area
    assert _peak(IMAGE, "full", 2048, 2048, None) == pytest.approx(4 * _peak(IMAGE, "full", 1024, 1024, None), rel=0.01)


def test_tiling_and_patch_parallel_cut_the_peak():
    for memory in (WAN, HUNYUAN_VIDEO, COGVIDEOX):
        full = _peak(memory, "full", 1280, 720, 81)
        assert _peak(memory, "tiled", 1280, 720, 81) < full / 2
        output = 3 * 81 * 1280 * 720 * 2 / GIB
        assert _peak(memory, "parallel", 1280, 720, 81, ranks=8) == pytest.approx(
            (full - memory.output_copies * output) / 8 + memory.output_copies * output / 8 + output, rel=1e-6)
    # an image no larger than one tile decodes whole
    assert _peak(IMAGE, "tiled", 1024, 1024, None) == _peak(IMAGE, "full", 1024, 1024, None)


def test_auto_takes_an_exact_mode_when_one_fits_and_tiles_only_when_none_does():
    work = make_workload(resolve_shape("hunyuanvideo"))
    one = ParallelDims()
    assert decode_modes(one, work) == ("full", "tiled")  # no patch-parallel decode for HunyuanVideo's VAE
    # 720p 129 frames on one rank: the full decode (69 GiB in the fp32 the runner keeps a video VAE in) needs
    # 110 GiB in all (its weights in fp32 too), the tiled one 49
    full = memory_per_rank(one, work, "full")["total"]
    assert full == pytest.approx(110.2, abs=0.2) and memory_per_rank(one, work, "tiled")["total"] < 50
    assert choose_decode(one, work, 140) == "full"
    assert choose_decode(one, work, full) == "full"
    assert choose_decode(one, work, 80) == "tiled"
    wan = make_workload(resolve_shape("wan2.1-14b"))
    assert decode_modes(ParallelDims(ulysses=8), wan) == ("parallel", "full", "tiled")
    assert choose_decode(ParallelDims(ulysses=8), wan, 80) == "parallel"
    assert choose_decode(ParallelDims(dp=8), wan, 80) == "full"
    with pytest.raises(ValueError, match="--vae-decode parallel is not available"):
        choose_decode(ParallelDims(dp=8), wan, 80, "parallel")


def test_hunyuanvideo_720p_129_frames_runs_on_one_and_two_80gb_gpus():
    # the case: rejected before ("needs 210 GiB per rank (vae_decode 170 GiB)")
    for gpus in (1, 2):
        best = plan("hunyuanvideo", gpus, width=1280, height=720, frames=129).best
        assert best.estimate.memory["total"] <= 79.6 and best.estimate.decode_mode in ("full", "tiled")
    # published systems tile it: that fits too, with room to spare (6,775 MiB counted in fp32 in
    # bench/results/cpu/vae_memory.txt, the dtype the runner keeps a video VAE in)
    tiled = plan("hunyuanvideo", 1, decode="tiled").best.estimate
    assert tiled.decode_mode == "tiled" and tiled.memory["vae_decode"] == pytest.approx(6774.6 / 1024, rel=0.02)
    assert tiled.memory["total"] < 79.6 - 25


def test_cogvideox15_1360x768_161_frames_runs_on_two_48gb_gpus():
    # the case: "no runnable layout" before; its full decode (45 GiB) does not fit beside the weights,
    # so auto tiles it on one rank, or splits the job over both ranks
    result = plan("cogvideox1.5-5b", 2, gpu="l40", width=1360, height=768, frames=161)
    best = result.best
    assert best.estimate.memory["total"] <= 45 and best.estimate.decode_mode == "tiled"
    full = estimate(best.layout, result.work, result.cluster, decode="full")
    assert full.memory["total"] > 45


def test_plan_with_a_decode_mode_prices_every_layout_in_it():
    tiled = plan("wan2.1-14b", 8, decode="tiled")
    assert {candidate.estimate.decode_mode for candidate in tiled.ranked} == {"tiled"}
    parallel = plan("wan2.1-14b", 8, decode="parallel")
    assert all(candidate.layout.group_size > 1 for candidate in parallel.ranked)
    single = next(r for r in parallel.rejected if r.layout == ParallelDims(dp=8))
    assert "--vae-decode parallel is not available" in single.reasons[0]


def test_a_tiled_decode_costs_more_time_than_a_full_one():
    work = make_workload(resolve_shape("hunyuanvideo"))
    cluster = make_cluster(1)
    full = estimate(ParallelDims(), work, cluster, decode="full")
    tiled = estimate(ParallelDims(), work, cluster, decode="tiled")
    assert tiled.decode_s == pytest.approx(full.decode_s * (256 / 192) ** 2)


def test_memory_fixes_keep_the_plans_decode_mode():
    result = plan("wan2.1-14b", 8, gpu_mem=40, decode="parallel")
    fixes = [rejection.fix for rejection in result.rejected if rejection.fix is not None]
    assert fixes and all(fix.decode_mode == "parallel" or fix.change.startswith("--vae-decode") for fix in fixes)
