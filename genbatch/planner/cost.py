"""Seconds per step and per job, and bytes per step, for one layout of one workload on one cluster.

Compute: per layer, 2 x tokens x (4d^2 + 2 d ffn [+ 2d^2 cross-attention]) linear FLOPs and 4 N^2 d attention
FLOPs (4 N T d for Wan's cross-attention), at a fraction of the GPU's peak. The linear layers lose
efficiency as each rank's GEMMs shrink to N/p rows (seed 000 §2.2), and every layer costs a fixed overhead
that splitting does not shrink. A model that keeps the prefix's keys and values (`ModelSpec.keeps_prefix_kv`:
Qwen-Image 2.1) runs all N tokens at its first step and the output's alone after, against all N keys: its
queries are the output's tokens plus the prefix's over the steps. `forward_flops` is one forward's total;
`bench/transformer_costs.py` holds it to FLOPs counted on every published transformer.

Communication per rank per layer, from seed 000 §1's table, over the slowest link the axis crosses:
Ulysses 4(p-1)/p^2 N d (four all-to-alls, not overlapped); Ring 2(p-1)/p N d (K/V passed around the ring,
overlapped with the attention of the block in hand, plus a fixed cost per round; inside a PipeFusion stage once
per patch forward, each passing the whole stale buffer); TP 4(p-1)/p N d (two
all-reduces, not overlapped); FSDP 2P/L (p-1)/p (the next layer's weights, prefetched under this layer's
compute); CFG one prediction exchange per step; PipeFusion N d per stage per step (asynchronous, in M
pieces); DistriFusion, each layer, an all-gather of this rank's K and V, 2 (N/p) d to each of the p-1 others,
hidden under the layer's compute (the larger of the two, plus the overlap tax) except in the synchronous warm-up
steps (their sum).

The stale-K/V methods' warm-up and asynchronous steps make a job as `stale_time` puts them together.

A batch of B rows in one forward (`Workload.batch`) is B times the tokens through every GEMM, so each rank's
GEMMs have B times the rows and climb the efficiency curve `rows / (rows + half_rows)` (SGLang's batch 16 at
512x512 on Qwen-Image: 3.21x the throughput of batch 1, where batch 2 at 1024x1024 gains 1.02x); attention runs
per row (B times one row's N^2), the activation messages carry B rows, and the fixed per-layer cost and FSDP's
weight gathers are paid once a batch. A job's seconds are its batch's over B; its VAE encode and decode run row
by row, so they stay one row's.

Under `--quantization fp8` on a GPU with FP8 GEMMs (`GpuType.fp8_tflops`: compute capability 8.9 or more) the
linear layers run at the FP8 rate (the runner scales each activation to FP8 as it comes); anywhere else, and
for int8, the weights are dequantized into bf16 GEMMs, priced at the bf16 rate. A profile's measured GEMM rate
is taken as bf16's and scaled by the GPU's FP8 / BF16 ratio. The weights are held and all-gathered at their
width (`Workload.weight_bytes_per_value`).

An image-conditioned job's VAE encode (`Workload.encode`) is priced as the decode is: the encoder's FLOPs
(`vae_encode`) at the VAE efficiency, split over the job's group where the VAE encodes patch-parallel, plus the
all-gather of the latent's mean and log variance to every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.planner.hardware import PCIE, Cluster, Link
from genbatch.parallel.dims import ParallelDims
from genbatch.parallel.formulas import StepShape, bytes_per_step
from genbatch.planner.layouts import axis_link, link_for_extent, token_shards
from genbatch.planner.memory import choose_decode, encode_ranks, memory_per_rank
from genbatch.planner.vae_encode import encode_flops
from genbatch.planner.profile import COLLECTIVE_OF_AXIS, Profile
from genbatch.planner.stale_time import (
    DISTRIFUSION_WARMUP_STEPS,
    PIPEFUSION_WARMUP_STEPS,
    pipefusion_job_seconds,
    stale_job_seconds,
)
from genbatch.planner.workload import BYTES_PER_VALUE, Workload

# Fitted together by least squares on log time to xDiT's FLUX.1-dev table (seed 000 §1: 1xH100 4.30 s,
# Ulysses-2 2.68, Ring-2 2.60, Ulysses-2 x Ring-2 1.80, Ulysses-4 1.63, Ring-4 1.98; tests/planner checks it).
GEMM_EFFICIENCY = 0.71
"""Fraction of the tensor-core peak large linear layers reach (compiled, bf16)."""
GEMM_HALF_ROWS = 256
"""Rows per rank at which linear layers reach half of `GEMM_EFFICIENCY` (small GEMMs fill fewer tiles)."""
LAYER_OVERHEAD_S = 230e-6
"""Fixed seconds per layer and forward (kernel launches, norms, modulation) that do not shrink with p."""
RING_ROUND_OVERHEAD_S = 60e-6
"""Fixed seconds per Ring round and layer (a smaller attention block and a P2P start each round)."""

OVERLAP_TAX = 0.5
"""Fraction of overlapped communication time that still costs: NCCL kernels take SMs and HBM bandwidth from the
compute they hide under. Chosen so the model agrees with seed 000 §8's NVLink table, which prefers Ulysses to
Ring for Wan2.1-14B and HunyuanVideo although Ring's traffic overlaps (FLUX's small Ring traffic barely feels it)."""

ATTENTION_EFFICIENCY = 0.30
"""Fraction of peak attention kernels reach: from HunyuanVideo 720p 129 frames 50 steps, 1904 s on one H100
(peers.md, xDiT), where attention is 87% of the FLOPs."""
VAE_EFFICIENCY = 0.30
"""Fraction of peak an image VAE decoder's 2-D convolutions reach: assumed (cuDNN convolutions in bf16)."""
VIDEO_VAE_EFFICIENCY = 0.076
"""Fraction of peak a video VAE decoder's 3-D convolutions, GroupNorms and causal caches reach: fitted to xDiT's
HunyuanVideo 720p 129 frames, 1904 s on one H100 against 337.6 s on eight (peers.md), the one published pair
that tells a one-rank decode from the denoise. xDiT decodes it on one rank with diffusers' tiling on; with
Ulysses 8 the 50 steps take about 239 s, so the ~99 s left is that decode: 7.5 PFLOP (25 MFLOP a pixel and
frame, framewise tiles overlapping 17/12, 256-pixel tiles every 192) at 7.6% of the peak. An end-to-end rate: it
carries whatever dtype that run's VAE used (not published), so no further factor is applied for the fp32 VAE
genbatch runs a video model with; only the output's gather counts bytes at that dtype."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """What one layout costs: time, bytes and memory, with the parts that explain them."""

    seconds_per_job: float
    """Wall time of one job: all steps, the stale-K/V methods' warm-up (and PipeFusion's bubble), the VAE encode
    and decode; with a batch of B rows, the batch's denoising over B plus one row's encode and decode."""
    seconds_per_step: float
    """Wall time of one steady-state denoising step (of the whole batch)."""
    compute_s: float
    """Per step: FLOPs over achieved throughput."""
    overhead_s: float
    """Per step: fixed per-layer costs."""
    comm_s: float
    """Per step: all communication as if nothing overlapped."""
    comm_exposed_s: float
    """Per step: the communication left on the critical path after overlap."""
    decode_s: float
    """Per job: the VAE decode (patch-parallel with gathering the output, or on the leader alone), and loading
    offloaded text encoders."""
    decode_mode: str
    """How the VAE decodes: `parallel` over the job group, `full` or `tiled` on its leader (`memory.choose_decode`)."""
    encode_s: float = 0.0
    """Per job: the VAE encode of an image-conditioned job (patch-parallel over the job group where the VAE
    has it, with the latent's all-gather); 0 for a job from noise alone."""
    pipeline_s: float
    """Per job: what the synchronous warm-up steps of PipeFusion and DistriFusion, and PipeFusion's pipeline
    bubble, add beyond steady-state steps."""
    comm_bytes_per_step: float
    """Bytes this rank sends per step, all collectives together."""
    comm_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes per step by axis: ulysses, ring, tp, fsdp, cfg, pp, distrifusion, sp_gather."""
    comm_messages: dict[str, float] = field(default_factory=dict)
    """Collectives (or transfers) per step by axis: each pays its link's latency."""
    links: dict[str, str] = field(default_factory=dict)
    """The link each active axis's traffic crosses."""
    memory: dict[str, float] = field(default_factory=dict)
    """GiB per rank by part (weights, text_encoder, vae_weights, activations, vae_decode, reserve, total)."""

    @property
    def memory_per_rank_gib(self) -> float:
        return self.memory["total"]


def _transfer(nbytes: float, link: Link, messages: int = 1) -> float:
    return nbytes / (link.gbs * 1e9) + messages * link.latency_s


def _overlapped(transfer_s: float, compute_s: float) -> float:
    """What a transfer hidden under `compute_s` still costs: the part that sticks out, plus the tax."""
    return max(0.0, transfer_s - compute_s) + OVERLAP_TAX * min(transfer_s, compute_s)


@dataclass(slots=True)
class _Tally:
    """Per-step communication, summed axis by axis; a profile's measured bandwidths replace the modelled time."""

    profile: Profile | None = None
    slicing: float = 1.0
    """`time_slicing` of the ranks on a CPU's cores, for the bytes of `COPY_BOUND_KINDS`."""
    nbytes: dict[str, float] = field(default_factory=dict)
    messages: dict[str, float] = field(default_factory=dict)
    raw_s: float = 0.0
    exposed_s: float = 0.0

    def add(self, axis: str, nbytes: float, raw_s: float, exposed_s: float, link: Link | None = None,
            messages: float = 0.0) -> None:
        kind = COLLECTIVE_OF_AXIS[axis]
        measured = self.profile.bandwidth(link.name, kind) if self.profile and link else None
        copying = self.slicing if kind in COPY_BOUND_KINDS else 1.0
        if measured is not None:  # effective bandwidth and latency: what these bytes added to a measured step
            latency = self.profile.latency(link.name, kind)
            raw_s = exposed_s = (copying * nbytes / (measured * 1e9)
                                 + messages * (link.latency_s if latency is None else latency))
        else:  # the link's figure (a bandwidth the fit held): its copying is time-sliced alike
            raw_s, exposed_s = copying * raw_s, copying * exposed_s
        self.nbytes[axis] = self.nbytes.get(axis, 0.0) + nbytes
        self.messages[axis] = self.messages.get(axis, 0.0) + messages
        self.raw_s += raw_s
        self.exposed_s += exposed_s


@dataclass(frozen=True, kw_only=True, slots=True)
class _Compute:
    """One rank's share of a step's arithmetic."""

    forwards: int
    """Forwards per step on this rank (2 for a CFG model without CFG parallel)."""
    layers: float
    """Layers on this rank's PipeFusion stage."""
    linear_s: float
    """Seconds of linear layers per layer and forward."""
    attention_s: float
    """Seconds of attention per layer and forward."""

    @property
    def layer_s(self) -> float:
        return self.linear_s + self.attention_s

    @property
    def step_s(self) -> float:
        return self.forwards * self.layers * self.layer_s


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTerms:
    """The inputs of a step's price that do not depend on the free parameters: what a fit regresses on."""

    linear_flops: float
    """Linear-layer FLOPs per step on this rank."""
    rows: float
    """Rows per rank of each linear layer's GEMM (tokens over sequence ranks, patches and TP)."""
    attention_flops: float
    """Attention FLOPs per step on this rank."""
    layer_forwards: float
    """Layer forwards per step on this rank (each pays the fixed per-layer cost)."""
    ranks: int
    """Ranks on one machine (they share a CPU's cores)."""


def _flops(layout: ParallelDims, work: Workload, *, patches: int) -> tuple[float, float, float]:
    """Linear and attention FLOPs per layer and forward of the whole batch, and the rows per rank of each GEMM."""
    shape = work.shape
    n, d, text, tp, batch = work.sequence, shape.hidden_size, shape.text_tokens, layout.tp, work.batch
    cross = not shape.joint_text
    queries = n
    if shape.keeps_prefix_kv:
        # the text's and condition image's keys and values are computed at the first step and kept: a later
        # step runs the output's tokens alone through every layer, attending to all n keys (Qwen-Image 2.1)
        own = work.image_tokens
        queries = own + (n - own) / work.steps
    # this rank's queries: its sequence shard (or DistriFusion patch) of each of the batch's rows
    tokens = batch * queries / token_shards(layout)
    linear = 2 * tokens * (4 * d * d + shape.mlp_matrices * d * shape.ffn_dim + (2 * d * d if cross else 0)) / tp
    linear += (4 * batch * text * d * d / tp) if cross else 0.0  # each row's text K/V projections, on every rank
    attention = 4 * tokens * (n + (text if cross else 0)) * d / tp  # each row attends over its own n keys
    rows = tokens / (patches * tp)  # TP narrows each GEMM as much as fewer rows would
    return linear, attention, rows


def forward_flops(work: Workload) -> float:
    """FLOPs of one transformer forward of the workload's batch on one rank: `_flops`' linear and attention FLOPs
    of a layer, times the layers (`bench/transformer_costs.py` holds it to FLOPs counted on each published model's
    transformer)."""
    linear, attention, _ = _flops(ParallelDims(), work, patches=1)
    return work.shape.num_layers * (linear + attention)


def _forwards_and_layers(layout: ParallelDims, work: Workload) -> tuple[int, float]:
    return (2 if work.shape.uses_cfg else 1) // layout.cfg, work.shape.num_layers / layout.pp


def step_terms(layout: ParallelDims, work: Workload, cluster: Cluster) -> StepTerms:
    """A steady step's FLOPs, rows and layer forwards on one rank of `layout`."""
    linear, attention, rows = _flops(layout, work, patches=layout.pp)
    forwards, layers = _forwards_and_layers(layout, work)
    return StepTerms(linear_flops=forwards * layers * linear, rows=rows, attention_flops=forwards * layers * attention,
                     layer_forwards=forwards * layers * layout.pp, ranks=cluster.gpus_per_node)


COPY_BOUND_KINDS = ("fsdp_all_gather", "p2p")
"""Collective kinds whose bytes are bulk copies of whole tensors: FSDP's parameter all-gathers and the ring's K/V
passes. On a CPU gloo copies them with the CPU, so ranks beyond its cores time-slice that copying as they do
compute (`time_slicing`). The kinds that move a step's activations in pieces (Ulysses' all-to-alls, the output
gather, the cfg exchange) spend their time waiting for peers, which other ranks' work fills; they are not
sliced. On `bench/calibration.py`'s runs (2 cores, 1 to 8 ranks), slicing these two kinds and no others is what
brought the 4-rank FSDP layouts from 9-31% under their measurements to -10%..+21%
(`bench/results/cpu/calibration-20261202.txt`); slicing every kind made the 8-rank layout 27-51% too slow."""


def time_slicing(ranks: int, cores: int | None) -> float:
    """How much longer a rank's CPU work takes when `ranks` processes time-slice a CPU's `cores`; 1 with ranks
    no more than the cores, and without cores (GPUs, profiles that did not record them)."""
    return max(1.0, ranks / cores) if cores else 1.0


def core_slowdown(sharing: float | None, ranks: int, cores: int | None = None) -> float:
    """How much longer compute takes when `ranks` share a CPU's `cores` (a profile's `core_sharing` and
    `cpu_cores`): ranks up to the cores slow each other by `1 + sharing (ranks - 1)` (memory bandwidth, caches),
    and ranks beyond them time-slice the cores, `time_slicing` longer again; without `cores`, the first term
    alone over every rank. 1 without a fitted sharing."""
    if sharing is None:
        return 1.0
    if cores is None:
        return 1.0 + sharing * (ranks - 1)
    return time_slicing(ranks, cores) * (1.0 + sharing * (min(ranks, cores) - 1))


def fp8_speedup(work: Workload, cluster: Cluster) -> float:
    """How much faster the linear layers' GEMMs run than in bf16: the GPU's FP8 / BF16 peak for fp8 weights on
    a GPU with FP8 GEMMs, else 1 (weight-only quantization dequantizes into bf16 GEMMs)."""
    fp8 = cluster.gpu.fp8_tflops
    if work.quantization.kind != "fp8" or not fp8:
        return 1.0
    return fp8 / cluster.gpu.bf16_tflops


def _compute(layout: ParallelDims, work: Workload, cluster: Cluster, *, patches: int,
             profile: Profile | None = None) -> _Compute:
    """Linear and attention seconds when the rank's N/sp tokens go through its layers in `patches` pieces."""
    linear, attention, rows = _flops(layout, work, patches=patches)
    peak = cluster.gpu.bf16_tflops * 1e12
    gemm, share = peak * fp8_speedup(work, cluster), GEMM_EFFICIENCY  # large-GEMM rate = gemm x share
    half_rows, attention_rate = GEMM_HALF_ROWS, peak * ATTENTION_EFFICIENCY
    if profile is not None:
        if profile.gemm_tflops is not None:
            gemm, share = profile.gemm_tflops * 1e12 * fp8_speedup(work, cluster), 1.0
        half_rows = profile.gemm_half_rows if profile.gemm_half_rows is not None else half_rows
        if profile.attention_tflops is not None:
            attention_rate = profile.attention_tflops * 1e12
    efficiency = share * rows / (rows + half_rows)
    slowdown = core_slowdown(profile.core_sharing if profile else None, cluster.gpus_per_node,
                             profile.cpu_cores if profile else None)
    forwards, layers = _forwards_and_layers(layout, work)
    return _Compute(
        forwards=forwards,
        layers=layers,
        linear_s=slowdown * (linear / (gemm * efficiency)),
        attention_s=slowdown * (attention / attention_rate),
    )


def layer_overhead(profile: Profile | None) -> float:
    """Fixed seconds per layer and forward: the profile's, else the published `LAYER_OVERHEAD_S`."""
    if profile is not None and profile.layer_overhead_s is not None:
        return profile.layer_overhead_s
    return LAYER_OVERHEAD_S


def _step_bytes(layout: ParallelDims, work: Workload, compute: _Compute) -> dict[str, float]:
    """Bytes this rank sends per step by ledger kind, from seed 000's formulas (`parallel/formulas.py`, which
    the runner's counted bytes are tested against): the planner and the runner share one implementation."""
    shape = work.shape
    tokens = work.batch * work.sequence  # a batch's activations travel together; the weights once a batch
    step = StepShape(tokens=tokens, width=shape.hidden_size, layers=compute.layers,
                     parameters=shape.parameters,
                     prediction_values=work.batch * work.prediction_bytes / BYTES_PER_VALUE,
                     value_bytes=BYTES_PER_VALUE, all_reduce_tokens=shape.tp_all_reduces * compute.layers * tokens,
                     weight_bytes=work.weight_bytes_per_value)
    return bytes_per_step(step, cfg=layout.cfg, ring=layout.ring, ulysses=layout.ulysses, fsdp=layout.fsdp_size > 1,
                          uses_cfg=shape.uses_cfg, tp=layout.tp, patches=layout.distrifusion)


def _communication(layout: ParallelDims, work: Workload, cluster: Cluster, compute: _Compute,
                   profile: Profile | None = None) -> tuple[_Tally, dict]:
    """Bytes, raw and exposed seconds per step of every collective but PipeFusion's, and the links they use."""
    u, r, tp = layout.ulysses, layout.ring, layout.tp
    per_step = compute.forwards * compute.layers or 1.0  # layer-forwards per step (cfg 2 of a one-branch model: 0)
    sent = _step_bytes(layout, work, compute)  # seed 000's bytes by kind: the runner's ledger's formulas
    cores = profile.cpu_cores if profile and profile.core_sharing is not None else None  # as `core_slowdown`
    tally, links = _Tally(profile=profile, slicing=time_slicing(cluster.gpus_per_node, cores)), {}
    overhead = layer_overhead(profile)
    if u > 1:
        link = links["ulysses"] = axis_link(layout, "ulysses", cluster)
        per_layer = sent["all_to_all"] / per_step  # four all-to-alls of this rank's [N/(u r), d/tp]
        time = _transfer(per_layer, link, messages=4)
        tally.add("ulysses", per_step * per_layer, per_step * time, per_step * time, link, per_step * 4)
    if r > 1:
        link = links["ring"] = axis_link(layout, "ring", cluster)
        chunk = sent["p2p"] / (per_step * (r - 1))  # K and V of N/r tokens, d/(u tp) channels, each round
        round_s = _transfer(chunk, link)
        passes = layout.pp  # PipeFusion: each of its M = P patch forwards passes every rank's whole K/V buffer
        exposed = passes * ((r - 1) * _overlapped(round_s, compute.attention_s / (r * passes))
                            + r * RING_ROUND_OVERHEAD_S)
        tally.add("ring", per_step * passes * (r - 1) * chunk, per_step * passes * (r - 1) * round_s,
                  per_step * exposed, link, per_step * passes * (r - 1))
    if tp > 1:
        link = links["tp"] = axis_link(layout, "tp", cluster)
        reduces = work.shape.tp_all_reduces  # the model's all-reduces a layer (TensorSplits.all_reduces_per_layer)
        per_layer = sent["tp_all_reduce"] / per_step  # `reduces` ring all-reduces of [N/sp, d]
        time = _transfer(per_layer, link, messages=reduces)
        tally.add("tp", per_step * per_layer, per_step * time, per_step * time, link, per_step * reduces)
    if layout.fsdp_size > 1:
        link = links["fsdp"] = link_for_extent(layout.group_size, cluster)
        per_layer = sent["fsdp_all_gather"] / per_step  # this rank's missing part of one layer's P/tp weights
        gather = _transfer(per_layer, link)
        # the first layer's gather waits; each next one is prefetched under the previous layer's compute
        exposed = gather + (compute.layers - 1) * _overlapped(gather, compute.layer_s + overhead)
        tally.add("fsdp", per_step * per_layer, per_step * gather, compute.forwards * exposed, link, per_step)
    shards = token_shards(layout)
    if shards > 1:
        link = links["sp_gather"] = link_for_extent(shards * tp, cluster)
        per_forward = sent["sp_gather"] / max(compute.forwards, 1)  # all-gather the output over the token shards
        time = _transfer(per_forward, link)
        tally.add("sp_gather", compute.forwards * per_forward, compute.forwards * time, compute.forwards * time, link,
                  compute.forwards)
    if layout.cfg > 1:
        link = links["cfg"] = axis_link(layout, "cfg", cluster)
        per_step_bytes = sent["cfg_exchange"]  # this rank's whole prediction (gathered first), once a step
        time = _transfer(per_step_bytes, link)
        tally.add("cfg", per_step_bytes, time, time, link, 1)
    return tally, {axis: link.name for axis, link in links.items()}


def _pipefusion(layout: ParallelDims, work: Workload, cluster: Cluster, compute: _Compute, tally: _Tally, step: float,
                profile: Profile | None = None) -> tuple[float, float, str]:
    """PipeFusion's asynchronous step (its P2P hides under compute: T / P) and its synchronous warm-up step (the
    stages one after another on the whole latent: T), in seconds, and the link between stages."""
    stages = patches = layout.pp  # as many patches as stages (xDiT's default)
    link = axis_link(layout, "pp", cluster)
    per_step = work.batch * work.sequence * work.shape.hidden_size * BYTES_PER_VALUE / (layout.sp * layout.tp)
    time = compute.forwards * _transfer(per_step, link, messages=patches)  # this stage's [N/sp, d], in M pieces
    step += _overlapped(time, compute.step_s)  # asynchronous P2P (seed 000 §6.3: N d per stage per step)
    tally.add("pp", compute.forwards * per_step, time, 0.0)
    whole = _compute(layout, work, cluster, patches=1, profile=profile)
    # warm-up: stages run one after another on the whole latent, no patches, no stale K/V
    warm_step = compute.forwards * work.shape.num_layers * (whole.layer_s + layer_overhead(profile))
    warm_step += stages * time + tally.exposed_s
    return step, warm_step, link.name


def _distrifusion(layout: ParallelDims, work: Workload, cluster: Cluster, compute: _Compute, tally: _Tally,
                  step: float, profile: Profile | None = None) -> tuple[float, float, str]:
    """DistriFusion's asynchronous step (each layer's K/V all-gather hidden under the layer: the larger of the
    two, plus `OVERLAP_TAX` of the hidden part, as for every overlapped transfer) and its synchronous warm-up
    step (the all-gathers waited at once: their sum), in seconds, and the link the patches' ranks share."""
    p = layout.distrifusion
    link = axis_link(layout, "distrifusion", cluster)
    # this rank's K and V, [N/p, d] each, to each of the p-1 others, every layer and forward
    per_layer = 2 * work.batch * work.sequence / p * work.shape.hidden_size * (p - 1) * BYTES_PER_VALUE
    gather = _transfer(per_layer, link)
    layer = compute.layer_s + layer_overhead(profile)  # one layer's compute, what the gather hides under
    forwards = compute.forwards * compute.layers
    before_raw, before_exposed = tally.raw_s, tally.exposed_s
    tally.add("distrifusion", forwards * per_layer, forwards * gather, forwards * _overlapped(gather, layer), link,
              forwards)
    raw, exposed = tally.raw_s - before_raw, tally.exposed_s - before_exposed  # a profile's measured time, if any
    return step + exposed, step + raw, link.name


def estimate(layout: ParallelDims, work: Workload, cluster: Cluster, profile: Profile | None = None,
             decode: str = "auto") -> Estimate:
    """Price `layout` (its structural validity is checked elsewhere), with `profile`'s fitted parameters where
    it has them and the published figures elsewhere; the VAE decodes in mode `decode` (`auto`: the first exact
    mode that fits the cluster's memory, tiled when none does)."""
    compute = _compute(layout, work, cluster, patches=layout.pp, profile=profile)
    overhead = compute.forwards * compute.layers * layout.pp * layer_overhead(profile)
    tally, links = _communication(layout, work, cluster, compute, profile)
    step = compute.step_s + overhead + tally.exposed_s
    denoise = work.steps * step
    if layout.pp > 1:
        step, warm_step, links["pp"] = _pipefusion(layout, work, cluster, compute, tally, step, profile)
        denoise = pipefusion_job_seconds(warm_step_s=warm_step, step_s=step, steps=work.steps, stages=layout.pp,
                                         patches=layout.pp, warmup=PIPEFUSION_WARMUP_STEPS)
    elif layout.distrifusion > 1:
        step, warm_step, links["distrifusion"] = _distrifusion(layout, work, cluster, compute, tally, step, profile)
        denoise = stale_job_seconds(warm_step_s=warm_step, step_s=step, steps=work.steps,
                                    warmup=DISTRIFUSION_WARMUP_STEPS)
    mode = choose_decode(layout, work, cluster.memory_gib, decode)
    decode_s = _decode_seconds(layout, work, cluster, mode)
    if work.offload_text_encoder:  # loaded from host memory for each batch, over the GPU's PCIe link
        decode_s += work.shape.text_encoder_parameters * work.text_encoder_bytes_per_value / (PCIE.gbs * 1e9) / work.batch
    encode_s = encode_seconds(layout, work, cluster)
    per_job = denoise / work.batch  # the batch's rows share its steps
    exposed = step - compute.step_s - overhead
    if abs(exposed) <= 1e-9 * step:  # the subtraction's rounding noise (-2.5e-16 s), not time
        exposed = 0.0
    return Estimate(
        seconds_per_job=per_job + encode_s + decode_s,
        seconds_per_step=step,
        compute_s=compute.step_s,
        overhead_s=overhead,
        comm_s=tally.raw_s,
        comm_exposed_s=exposed,
        decode_s=decode_s,
        decode_mode=mode,
        encode_s=encode_s,
        pipeline_s=per_job - work.steps * step / work.batch,
        comm_bytes_per_step=sum(tally.nbytes.values()),
        comm_bytes=tally.nbytes,
        comm_messages=tally.messages,
        links=links,
        memory=memory_per_rank(layout, work, mode),
    )


def _decode_seconds(layout: ParallelDims, work: Workload, cluster: Cluster, mode: str) -> float:
    """The VAE decode in `mode`: patch-parallel over the job's group, then gathering the frames to the group's
    leader at the VAE's dtype (`Workload.vae_bytes_per_value`); or the leader alone (tiling decodes the tiles'
    overlaps twice)."""
    shape = work.shape
    flops = work.megapixels * 1e6 * shape.vae_costs.mflop_per_pixel * 1e6
    flops *= shape.vae_costs.decoder.work(mode)
    efficiency = VIDEO_VAE_EFFICIENCY if shape.is_video else VAE_EFFICIENCY
    ranks = layout.group_size if mode == "parallel" else 1
    seconds = flops / (cluster.gpu.bf16_tflops * 1e12 * efficiency * ranks)
    if ranks > 1:
        pixels = work.megapixels * 1e6 * 3 * work.vae_bytes_per_value
        seconds += _transfer(pixels * (ranks - 1) / ranks, link_for_extent(ranks, cluster))
    return seconds


def encode_seconds(layout: ParallelDims, work: Workload, cluster: Cluster) -> float:
    """One row's VAE encode before denoising, priced as the decode is: the encoder's FLOPs at the VAE efficiency
    over the ranks that share it (`memory.encode_ranks`), plus the all-gather of the latent's mean and log
    variance (2 x 16 channels per latent pixel, at the VAE's dtype) to every rank; 0 without an image."""
    source = work.encode
    if source is None:
        return 0.0
    shape = work.shape
    memory = shape.vae_costs.encoder
    efficiency = VIDEO_VAE_EFFICIENCY if shape.is_video else VAE_EFFICIENCY
    ranks = encode_ranks(layout, work)
    flops = encode_flops(memory, width=source.width, height=source.height, frames=source.frames)
    seconds = flops / (cluster.gpu.bf16_tflops * 1e12 * efficiency * ranks)
    if ranks > 1:
        frames = max(source.frames or 1, 1)
        latent_frames = (frames - 1) // shape.vae_temporal + 1 if shape.is_video else 1
        latent = 2 * shape.out_channels * latent_frames * (source.width // shape.vae_spatial) * (
            source.height // shape.vae_spatial) * work.vae_bytes_per_value
        seconds += _transfer(latent * (ranks - 1) / ranks, link_for_extent(ranks, cluster))
    return seconds
