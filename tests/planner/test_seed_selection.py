"""The planner's picks against seed 000's selection tables (section 8) and self-test answers (section 11).

Each test quotes the seed's wording it encodes. "Overall" means the best layout the cost model finds,
including PipeFusion and TP that genbatch's runner does not have yet; "runnable" means `plan.best`.
"""

from __future__ import annotations

from dataclasses import replace

from genbatch.parallel.dims import ParallelDims
from genbatch.planner import best_layout, plan
from genbatch.planner.cost import estimate
from genbatch.planner.hardware import make_cluster
from genbatch.planner.layouts import crosses_nodes
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.workload import make_workload


def _overall(model, gpus, **options):
    return plan(model, gpus, objective="latency", **options).ranked[0].layout


# --- section 8, single node NVLink (8xH100) -------------------------------------------------------------------


def test_flux_nvlink_ulysses_4_or_8_rest_dp():
    # "FLUX 1024²（无 CFG） 推荐 Ulysses 4（1.63 s）或 8；剩余卡做 DP ... 不推荐 PipeFusion（有气泡）、TP 8"
    for layout in (_overall("flux.1-dev", 8), plan("flux.1-dev", 8, objective="latency").best.layout):
        assert layout.ulysses in (4, 8) and layout.dp == 8 // layout.ulysses
        assert layout.ring == layout.cfg == layout.pp == layout.tp == 1
    ranked = [candidate.layout for candidate in plan("flux.1-dev", 8, objective="latency").ranked]
    tp8 = next(i for i, layout in enumerate(ranked) if layout.tp == 8)
    # USP over the whole node
    usp = next(i for i, layout in enumerate(ranked)
               if layout.ulysses >= 2 and layout.ring == 2 and layout.tp == 1 and layout.pp == 1)
    assert ranked.index(ParallelDims(ulysses=8)) < usp < tp8  # "备选 Ulysses 2 × Ring 2", "不推荐 TP 8"


def test_qwen_image_nvlink_cfg2_ulysses_or_ulysses():
    # "Qwen-Image（CFG） CFG 2 × Ulysses 2–4 vs Ulysses 4–8 实测"
    for layout in (_overall("qwen-image", 8), plan("qwen-image", 8, objective="latency").best.layout):
        assert (layout.cfg == 2 and layout.ulysses in (2, 4)) or (layout.cfg == 1 and layout.ulysses in (4, 8))
        assert layout.ring == layout.pp == layout.tp == 1


def test_wan_14b_nvlink_cfg2_ulysses4_vae_over_8():
    # "Wan 14B 720p（CFG） CFG 2 × Ulysses 4，VAE patch 并行 8 | 备选 Ulysses 8；加 Ring 若 all-to-all 慢 | 不推荐 TP"
    result = plan("wan2.1-14b", 8, objective="latency")
    assert result.ranked[0].layout == result.best.layout == ParallelDims(cfg=2, ulysses=4)
    assert best_layout("wan2.1-14b", 8, objective="latency")["vae_parallel"] == 8
    ranked = [candidate.layout for candidate in result.ranked]
    assert ranked.index(ParallelDims(ulysses=8)) < min(i for i, layout in enumerate(ranked) if layout.tp > 1)


def test_hunyuanvideo_nvlink_ulysses8_then_ulysses4_ring2():
    # "HunyuanVideo（无 CFG） Ulysses 8 | 备选 Ulysses 4 × Ring 2"; at 720p 129 frames its exact decode (69 GiB in
    # the fp32 of the runner's video VAE, on one rank: its VAE has no patch-parallel decode) fits on an H100 only
    # beside FSDP-sharded weights, and beats the replicated layouts' tiled decode (tiles' overlaps decode twice)
    ranked = [candidate for candidate in plan("hunyuanvideo", 8, objective="latency").ranked]
    assert ranked[0].layout == ParallelDims(ulysses=8, fsdp=True)
    assert ranked[1].layout == ParallelDims(ring=2, ulysses=4, fsdp=True)
    assert ranked[0].estimate.decode_mode == "full"
    replicated = next(candidate for candidate in ranked if candidate.layout == ParallelDims(ulysses=8))
    assert replicated.estimate.decode_mode == "tiled" and replicated.estimate.decode_s > ranked[0].estimate.decode_s


# --- section 8, single node PCIe (8xL40) ----------------------------------------------------------------------


def test_pcie_small_ulysses_rest_pipefusion_cfg_as_usual():
    # "单节点 PCIe（8×L40 / A10）：Ulysses 度 ≤ 2–4、其余给 PipeFusion；CFG 并行照常（通信为零）"
    flux = _overall("flux.1-dev", 8, gpu="l40")
    assert flux.pp >= 2 and flux.ulysses <= 4 and flux.dp == 1
    for model in ("sd3-medium", "qwen-image"):
        layout = _overall(model, 8, gpu="l40")
        assert layout.cfg == 2 and layout.pp >= 2 and layout.ulysses <= 4 and layout.dp == 1


def test_pcie_pipefusion_wins():
    result = plan("flux.1-dev", 8, gpu="l40", objective="latency")
    assert result.best is result.ranked[0] and result.best.layout.pp > 1


# --- section 8, across nodes ------------------------------------------------------------------------------------


def test_across_nodes_ulysses_inside_pipefusion_over_ethernet():
    # "跨节点：节点内 Ulysses、跨节点 Ring（IB）或 PipeFusion（以太网）"; section 1: "xDiT 用 Ulysses 4 × PipeFusion 4
    # 让 16 卡比 8 卡再快 1.16 倍" (two 8xL40 machines over Ethernet)
    result = plan("flux.1-dev", 16, nodes=2, gpu="l40", interconnect="ethernet", objective="latency")
    best = result.ranked[0].layout
    assert best == ParallelDims(pp=4, ulysses=4)
    assert crosses_nodes(best, "pp", result.cluster) and not crosses_nodes(best, "ulysses", result.cluster)
    one_node = plan("flux.1-dev", 8, gpu="l40", objective="latency").ranked[0].estimate.seconds_per_job
    assert result.ranked[0].estimate.seconds_per_job < one_node  # 16 cards beat 8


def test_across_nodes_cfg_groups_on_two_nodes():
    # "CFG 并行的两组尽量放在两个节点上（跨节点只传 0.6 MB）"
    for network in ("infiniband", "ethernet"):
        result = plan("wan2.1-14b", 16, nodes=2, interconnect=network, objective="latency")
        best = result.best.layout
        assert best == ParallelDims(cfg=2, ulysses=8)
        assert crosses_nodes(best, "cfg", result.cluster) and not crosses_nodes(best, "ulysses", result.cluster)


def test_ulysses_never_crosses_nodes():
    result = plan("hunyuanvideo", 16, nodes=2, objective="latency")
    for candidate in result.ranked:
        assert not crosses_nodes(candidate.layout, "ulysses", result.cluster)
    assert any("keep ulysses inside a node" in reason for rejection in result.rejected for reason in rejection.reasons)


# --- section 8.3: SP is required for video ----------------------------------------------------------------------


def test_video_needs_splitting_on_80gb():
    # "视频上 SP 是必需 ... 80 GB 卡在 129 帧 / 1080p 上已放不下 VAE 与余量": with the decoders' and the blocks' own
    # peaks (a frame-causal decode of 9 GiB, not the seed's 107; 12 [N, d] tensors of activations, not 20) 1080p x
    # 129 frames still fits one 80 GB rank (70 GiB); 201 frames (47 GiB of activations) does not
    result = plan("wan2.1-14b", 8, width=1920, height=1080, frames=201)
    assert result.best.layout.dp < 8
    dp8 = next(rejection for rejection in result.rejected if rejection.layout == ParallelDims(dp=8))
    assert "GiB per rank" in dp8.reasons[0]


# --- section 11, self-test answers ------------------------------------------------------------------------------


def _flux_cost(layout: ParallelDims, cluster, **shape):
    return estimate(layout, make_workload(replace(resolve_shape("flux.1-dev"), **shape)), cluster)


def test_q1_tp4_and_ulysses4_bytes_and_time():
    # "TP：... 85 MB / 层 × 57 = 4.8 GB → 16 ms（... 且在关键路径）。Ulysses：... 21 MB / 层 → 1.2 GB → 4 ms（10%）"
    cluster = make_cluster(4)
    # the seed's answer charges every layer 2 all-reduces (its standard case); FLUX's own plan does 4/3 a layer
    tp = _flux_cost(ParallelDims(tp=4), cluster, tp_all_reduces=2.0)
    ulysses = _flux_cost(ParallelDims(ulysses=4), cluster)
    assert abs(_flux_cost(ParallelDims(tp=4), cluster).comm_bytes["tp"] / tp.comm_bytes["tp"] - 2 / 3) < 1e-9
    assert abs(tp.comm_bytes["tp"] / 4.8e9 - 1) < 0.05 and abs(ulysses.comm_bytes["ulysses"] / 1.2e9 - 1) < 0.05
    assert 0.014 < tp.comm_s < 0.019 and 0.003 < ulysses.comm_s < 0.008
    assert tp.comm_exposed_s == tp.comm_s  # neither overlaps
    assert 0.3 < tp.comm_s / ulysses.compute_s < 0.5 and ulysses.comm_s / ulysses.compute_s < 0.2


def test_q2_ring_vs_pipefusion_over_ethernet():
    # "Ring-2 跨节点：... 28 MB / 层 × 57 = 1.6 GB → 0.5 s / 步，远超每步计算。PipeFusion-2：每步每 stage 传 N d = 28 MB → 10 ms"
    cluster = make_cluster(2, nodes=2, gpu="l40", interconnect="ethernet")
    ring, pipe = _flux_cost(ParallelDims(ring=2), cluster), _flux_cost(ParallelDims(pp=2), cluster)
    assert abs(ring.comm_bytes["ring"] / 1.6e9 - 1) < 0.05 and 0.45 < ring.comm_s < 0.6
    assert ring.comm_exposed_s > 0.5 * ring.comm_s  # far beyond the attention it could hide under
    assert abs(pipe.comm_bytes["pp"] / 28e6 - 1) < 0.05 and 0.007 < pipe.comm_s < 0.013
    assert pipe.seconds_per_step < ring.seconds_per_step / 2


def test_q3_cfg_parallel_does_not_apply_to_guidance_distilled_models():
    # "FLUX.1-dev 与 HunyuanVideo 是 guidance 蒸馏模型，每步只有一次前向，没有第二个分支可切"
    for model in ("flux.1-dev", "hunyuanvideo"):
        result = plan(model, 8)
        assert all(candidate.layout.cfg == 1 for candidate in result.ranked)
        assert any("classifier-free guidance" in reason for r in result.rejected for reason in r.reasons)
    # "条件与无条件分支 ... 每步一次 [N, c p²]（FLUX 形状 0.6 MB）": priced on FLUX's shape
    exchange = _flux_cost(ParallelDims(cfg=2), make_cluster(2)).comm_bytes["cfg"]
    assert 0.45e6 < exchange < 0.65e6


def test_q4_stale_kv_needs_many_steps_and_pipefusion_keeps_its_layers_kv():
    # "stale K/V 的前提是相邻步激活相似 ... 4 步模型 ... 不能用"; "PipeFusion 每卡只存自己 L/p 层的（FLUX 4 stage 0.8 GB）"
    result = plan("flux.1-dev", 8, steps=4, gpu="l40", objective="latency")
    assert all(candidate.layout.pp == 1 for candidate in result.ranked)
    assert any("too few" in reason for rejection in result.rejected for reason in rejection.reasons)
    four = _flux_cost(ParallelDims(pp=4), make_cluster(4))
    one = _flux_cost(ParallelDims(dp=4), make_cluster(4))
    stale_gib = four.memory["activations"] - one.memory["activations"] / 4
    assert 0.65 < stale_gib * 2**30 / 1e9 < 0.9
    assert abs(four.memory["weights"] * 4 - one.memory["weights"]) < 0.01  # weights split 1/p by layer


def test_q5_throughput_only_means_data_parallel_8():
    # "data parallel 8：每卡独立跑一个请求 ... 只有当单卡放不下或延迟 SLO 要求时才切请求"
    assert best_layout("flux.1-dev", 8) == {"dp": 8, "cfg": 1, "distrifusion": 1, "pp": 1, "ring": 1, "ulysses": 1,
                                             "tp": 1, "fsdp": 1, "vae_parallel": 1}
    # section 2: "四张卡各跑一个请求的吞吐（4 张 / 4.30 s）永远高于四张卡切一个请求"
    ranked = plan("flux.1-dev", 4).ranked
    assert ranked[0].layout == ParallelDims(dp=4)
    assert all(ranked[0].jobs_per_hour > candidate.jobs_per_hour for candidate in ranked[1:])
