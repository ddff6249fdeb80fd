"""Peak memory per rank for a layout: weights, activations, stale K/V, the VAE encode and the VAE decode.

Encoding, denoising and decoding do not overlap, so the peak is the resident weights plus the largest of the
denoise activations (stale K/V included), the VAE decode and, for a job that starts from an image, the VAE
encode. Seed 000 gives the rules: weights are replicated under
sequence, CFG and DistriFusion parallel and split 1/p under FSDP (text encoders too), TP and PipeFusion (by
layer); activations split 1/p under sequence parallel and DistriFusion (each rank holds [N/p, d]). Stale K/V, per
CFG branch a rank runs: PipeFusion 2 x N x d x L/p (a stage's layers) over its sequence ranks, DistriFusion 2 x N x d x L (`stale_fit`).
A model that keeps its prefix's keys and values (Qwen-Image 2.1) holds 2 x prefix x d x L per branch beside the
activations (`kept_prefix_bytes`; `bench/transformer_costs.py` counts the cache diffusers fills).
The VAE decode peak is the decoder's own (`vae_memory`: frame-causal, framewise or tiled as diffusers decodes),
split 1/p with patch parallel over the job's group (§7.1). The VAE encode's is the encoder's own (`vae_encode`:
Wan's frame-causal chunks, an image VAE whole, beside the input the pipeline built), split 1/p over the job's
group where the VAE class encodes patch-parallel (the runner's `parallel_encoding` always does, on a group of
two or more), on one rank otherwise. Under `--quantization fp8|int8` the transformer's weights take 1 byte a
parameter instead of bf16's 2 (the text encoders' too with `--quantize-text-encoder`): the shape's parameter
counts times the width, for any model. Both run at the VAE's dtype (`Workload.vae_bytes_per_value`: fp32 for a
video model, as the runner keeps it, bf16 for an image model). A batch of B rows (`Workload.batch`) holds B times
the activations and the stale K/V; the weights do not grow, and the VAE encodes and decodes its rows one at a time.

The decode mode is the layout's choice too: `auto` takes the first exact mode that fits (patch-parallel over
the group where the VAE has it, then a one-rank full decode) and tiling only when neither does, since tiles are
blended and the output is not the full decode's.
"""

from __future__ import annotations

from genbatch.models import families
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.hardware import GIB
from genbatch.planner.layouts import token_shards
from genbatch.planner.stale_fit import branches_per_rank, stale_kv_bytes
from genbatch.planner.vae_encode import encode_peak_bytes
from genbatch.planner.vae_memory import EXACT_MODES, decode_peak_bytes, first_fitting
from genbatch.planner.workload import BYTES_PER_VALUE, Workload

ACTIVATION_TENSORS = 12
"""Denoise activation peak of one forward, in [N, d] bf16 tensors: counted on a real-width Wan 2.1-14B block stack
in bf16 (d = 5,120, ffn 13,824; live tensors under a dispatch mode, `bench/vae_memory.py`): 11.4 at N = 4,096,
12.6 at N = 1,024 (bench/results/cpu/vae_memory.txt). Seed 000 §8.3's figures (Wan2.1-14B 720p 81 frames
14.4 GiB, N = 75,600) are 20 such tensors: two guidance branches batched, where genbatch runs them one after the
other (or on two ranks with CFG parallel)."""
RESERVE_GIB = 2.0
"""CUDA context, allocator slack and NCCL buffers per rank: assumed."""
FSDP_PREFETCH_LAYERS = 2
"""Unsharded layers alive under FSDP: the one computing and the one being prefetched."""


DECODE_CHOICES = ("auto", "full", "tiled", "parallel")
"""What `--vae-decode` takes: a mode of `vae_memory.DECODE_MODES`, or `auto`."""


def patch_parallel_classes() -> frozenset[str]:
    """The VAE classes genbatch decodes patch-parallel (`ModelFamily.vae_classes`)."""
    return frozenset(name.partition(":")[2] for family in families().values() for name in family.vae_classes)


def decode_modes(layout: ParallelDims, work: Workload) -> tuple[str, ...]:
    """The decode modes this layout can run, exact ones first in `auto`'s order, then tiling where the VAE has it."""
    shape = work.shape
    memory = shape.vae_costs.decoder
    modes = [mode for mode in EXACT_MODES if mode == "full"
             or (layout.group_size > 1 and memory.vae_class in patch_parallel_classes())]
    return (*modes, "tiled") if memory.tile is not None else tuple(modes)


def vae_decode_gib(layout: ParallelDims, work: Workload, mode: str) -> float:
    """The decode's peak on the group's leader in `mode`, GiB, at the VAE's dtype (`Workload.vae_bytes_per_value`,
    as the encode's)."""
    memory = work.shape.vae_costs.decoder
    ranks = layout.group_size if mode == "parallel" else 1
    return decode_peak_bytes(memory, mode, width=work.width, height=work.height, frames=work.frames, ranks=ranks,
                             bytes_per_value=work.vae_bytes_per_value) / GIB


def encode_ranks(layout: ParallelDims, work: Workload) -> int:
    """The ranks that share a job's VAE encode: its group where the VAE class encodes patch-parallel, else 1."""
    parallel = layout.group_size > 1 and work.shape.vae_class in patch_parallel_classes()
    return layout.group_size if parallel else 1


def vae_encode_gib(layout: ParallelDims, work: Workload) -> float:
    """The VAE encode's peak per rank before denoising, GiB; 0 for a job that starts from noise alone."""
    source = work.encode
    if source is None:
        return 0.0
    return encode_peak_bytes(work.shape.vae_costs.encoder, width=source.width, height=source.height, frames=source.frames,
                             ranks=encode_ranks(layout, work), bytes_per_value=work.vae_bytes_per_value) / GIB


def choose_decode(layout: ParallelDims, work: Workload, limit_gib: float, wanted: str = "auto") -> str:
    """The decode mode the layout runs: `wanted`, or with `auto` the first of `decode_modes` whose peak fits in
    `limit_gib` per rank (the smallest when none does: the layout is then rejected for memory)."""
    modes = decode_modes(layout, work)
    if wanted != "auto":
        if wanted not in modes:
            raise ValueError(f"--vae-decode {wanted} is not available for {work.shape.name} on {layout.name} "
                             f"(it can decode {', '.join(modes)}); choose one of those, or auto")
        return wanted
    return first_fitting(modes, lambda mode: memory_per_rank(layout, work, mode)["total"], limit_gib)


def text_encoder_gib(layout: ParallelDims, work: Workload) -> float:
    """The text encoders' weights per rank, GiB (at their width: `--quantize-text-encoder`), as the runner's
    `--text-encoder-parallel auto` holds them: the
    layers of an encoder at least 4096 wide split over the job group, its other weights (embeddings, output head,
    a vision tower) whole on every rank; a narrower encoder sharded by FSDP over the job group, else whole."""
    shape = work.shape
    split = shape.text_encoder_split_parameters
    if split:
        whole = shape.text_encoder_parameters - split
        return (split / layout.group_size + whole) * work.text_encoder_bytes_per_value / GIB
    return shape.text_encoder_parameters * work.text_encoder_bytes_per_value / layout.fsdp_size / GIB


def kept_prefix_bytes(layout: ParallelDims, work: Workload) -> float:
    """Bytes of the prefix's keys and values a model that keeps them (`ModelSpec.keeps_prefix_kv`: Qwen-Image 2.1)
    holds on one rank through the denoise: K and V of the tokens before the output's (text and condition image),
    every layer, for each CFG branch the rank runs (each branch keeps its own), split by TP heads; 0 for others."""
    shape = work.shape
    if not shape.keeps_prefix_kv:
        return 0.0
    prefix = work.sequence - work.image_tokens
    return (work.batch * 2 * prefix * shape.hidden_size * BYTES_PER_VALUE * shape.num_layers / layout.tp
            * branches_per_rank(shape, layout))


def memory_per_rank(layout: ParallelDims, work: Workload, decode: str = "full") -> dict[str, float]:
    """GiB per rank by part with the VAE decoded in mode `decode`, and `total` (the peak): on the group's
    leader, the fullest rank (it gathers the decoded output)."""
    shape = work.shape
    d, layers = shape.hidden_size, shape.num_layers
    patches = layout.pp  # PipeFusion streams as many patches as it has stages (xDiT's default)
    weight_bytes = shape.parameters * work.weight_bytes_per_value  # bf16, or fp8 / int8 under --quantization
    weights = weight_bytes / (layout.fsdp_size * layout.pp * layout.tp)
    if layout.fsdp_size > 1:
        weights += FSDP_PREFETCH_LAYERS * weight_bytes / layers
    # (N, d) split over sequence ranks (or DistriFusion patches), PipeFusion patches and TP columns
    pieces = token_shards(layout) * patches * layout.tp
    activations = work.batch * ACTIVATION_TENSORS * work.sequence * d * BYTES_PER_VALUE / pieces
    stale_kv = work.batch * stale_kv_bytes(shape, work.width, work.height, work.frames, layout,
                                           BYTES_PER_VALUE)  # DistriFusion
    if layout.pp > 1:
        # seed 000 §6.3: a stage keeps the K and V of all N tokens for its L/p layers (2 N d per layer) for each
        # CFG branch it runs; a sequence rank keeps its Ulysses heads of them and, under Ring, its 1/R of the
        # tokens (`parallel.pipeline.state`), split by TP heads as well
        branches = branches_per_rank(shape, layout)
        split = layout.tp * layout.ulysses * layout.ring
        stale_kv = work.batch * 2 * work.sequence * d * BYTES_PER_VALUE * (layers / layout.pp) / split * branches
    activations += kept_prefix_bytes(layout, work)  # alive beside every step's activations
    parts = {
        "weights": weights / GIB,
        "text_encoder": 0.0 if work.offload_text_encoder else text_encoder_gib(layout, work),
        "vae_weights": shape.vae_parameters * work.vae_bytes_per_value / GIB,  # fp32 for a video model
        "activations": (activations + stale_kv) / GIB,
        "stale_kv": stale_kv / GIB,  # of the activations: the previous step's K/V kept for the other patches
        "vae_decode": vae_decode_gib(layout, work, decode),  # one row at a time, whatever the batch
        "vae_encode": vae_encode_gib(layout, work),  # likewise; 0 without an image
        "reserve": RESERVE_GIB,
    }
    resident = parts["weights"] + parts["text_encoder"] + parts["vae_weights"] + parts["reserve"]
    parts["total"] = resident + max(parts["activations"], parts["vae_decode"], parts["vae_encode"])
    return parts
