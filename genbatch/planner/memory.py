"""Peak memory per rank for a layout: weights, activations, PipeFusion's stale K/V and the VAE decode.

Denoising and decoding do not overlap, so the peak is the resident weights plus the larger of the denoise
activations and the VAE decode. Seed 000 gives the rules: weights are replicated under sequence and CFG
parallel and split 1/p under FSDP (text encoders too), TP and PipeFusion (by layer); activations split 1/p under
sequence parallel (each rank holds [N/p, d]); the VAE decode peak splits 1/p with patch parallel over the job's
group (§7.1).
"""

from __future__ import annotations

from genbatch.parallel.dims import ParallelDims
from genbatch.planner.hardware import GIB
from genbatch.planner.workload import BYTES_PER_VALUE, Workload

ACTIVATION_TENSORS = 20
"""Denoise activation peak in [N, d] bf16 tensors: seed 000 §8.3 gives Wan2.1-14B 720p 81 frames 14.4 GiB
(N = 75,600, d = 5,120: 20 such tensors), 129 frames 22.7 GiB and 1080p 32 GiB (both match 20 x N x d)."""
RESERVE_GIB = 2.0
"""CUDA context, allocator slack and NCCL buffers per rank: assumed."""
FSDP_PREFETCH_LAYERS = 2
"""Unsharded layers alive under FSDP: the one computing and the one being prefetched."""


def memory_per_rank(layout: ParallelDims, work: Workload) -> dict[str, float]:
    """GiB per rank by part, and `total` (the peak)."""
    shape = work.shape
    d, layers = shape.hidden_size, shape.num_layers
    patches = layout.pp  # PipeFusion streams as many patches as it has stages (xDiT's default)
    weight_bytes = shape.parameters * BYTES_PER_VALUE
    weights = weight_bytes / (layout.fsdp_size * layout.pp * layout.tp)
    if layout.fsdp_size > 1:
        weights += FSDP_PREFETCH_LAYERS * weight_bytes / layers
    # (N, d) split over sequence ranks, PipeFusion patches and TP columns
    activations = ACTIVATION_TENSORS * work.sequence * d * BYTES_PER_VALUE / (layout.sp * patches * layout.tp)
    stale_kv = 0.0
    if layout.pp > 1:
        # seed 000 §6.3: a stage keeps the K and V of all N tokens for its L/p layers (2 N d per layer),
        # whole in every sequence rank (seed 001 §5.4), split by TP heads.
        stale_kv = 2 * work.sequence * d * BYTES_PER_VALUE * (layers / layout.pp) / layout.tp
    vae_decode = work.megapixels * shape.vae_gib_per_mpx * GIB / layout.group_size
    parts = {
        "weights": weights / GIB,
        # the runner's FSDP shards the text encoders over the job group too
        "text_encoder": 0.0 if work.offload_text_encoder
        else shape.text_encoder_parameters * BYTES_PER_VALUE / layout.fsdp_size / GIB,
        "vae_weights": shape.vae_parameters * BYTES_PER_VALUE / GIB,
        "activations": (activations + stale_kv) / GIB,
        "vae_decode": vae_decode / GIB,
        "reserve": RESERVE_GIB,
    }
    resident = parts["weights"] + parts["text_encoder"] + parts["vae_weights"] + parts["reserve"]
    parts["total"] = resident + max(parts["activations"], parts["vae_decode"])
    return parts
