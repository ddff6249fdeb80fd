"""Whether a job's stale K/V fit on each rank beside the weights (DistriFusion), as a pure function.

DistriFusion keeps, on every rank, the K and V of every token for every layer: 2 x N x d x L values per CFG
branch the rank runs (N counts the text tokens too where they join the self-attention). For Wan 2.1 14B at
720p (81 frames: 75,600 tokens, d 5120, 40 layers) that is 62 GB per branch in bf16, beside 28.6 GB of
weights: no 80 GB GPU holds it. A row that does not fit is rejected alone, with these numbers.
"""

from __future__ import annotations

from genbatch.models.shapes import ModelShape
from genbatch.parallel.dims import ParallelDims

USABLE_FRACTION = 0.9
"""The share of a device's memory the weights and the K/V may fill (the rest: activations, the allocator)."""
GB = 1e9


def branches_per_rank(shape: ModelShape, layout: ParallelDims) -> int:
    """CFG branches one rank runs: both on one rank, one each under `--cfg 2`, one for a guidance-free model."""
    return max((2 if shape.uses_cfg else 1) // layout.cfg, 1)


def stale_kv_bytes(shape: ModelShape, width: int, height: int, frames: int | None, layout: ParallelDims,
                   element_bytes: int = 2) -> float:
    """Bytes of K/V one rank keeps under DistriFusion: 2 x N x d x L per branch it runs (0 for exact layouts)."""
    if layout.distrifusion == 1:
        return 0.0
    tokens = shape.sequence(width, height, frames)
    return 2.0 * tokens * shape.hidden_size * shape.num_layers * element_bytes * branches_per_rank(shape, layout)


def stale_fit_problem(shape: ModelShape, width: int, height: int, frames: int | None, layout: ParallelDims,
                      memory_bytes: float, element_bytes: int = 2) -> str | None:
    """Why a job of this size cannot keep its stale K/V beside the weights in `memory_bytes` per rank (with the
    numbers and the fix), or None when it can."""
    kv = stale_kv_bytes(shape, width, height, frames, layout, element_bytes)
    if kv == 0.0:
        return None
    weights = shape.parameters * element_bytes
    budget = USABLE_FRACTION * memory_bytes
    if kv + weights <= budget:
        return None
    branches = branches_per_rank(shape, layout)
    per_branch = kv / branches
    return (f"--distrifusion keeps every layer's K and V of all {shape.sequence(width, height, frames)} tokens on "
            f"each rank: {per_branch / GB:.1f} GB per CFG branch x {branches} = {kv / GB:.1f} GB, beside "
            f"{weights / GB:.1f} GB of weights, over the {budget / GB:.1f} GB a rank may fill "
            f"({USABLE_FRACTION:.0%} of {memory_bytes / GB:.1f} GB); make the row smaller, "
            f"{'add --cfg 2 (one branch a rank), ' if branches > 1 else ''}or run it with exact sequence parallel "
            "(--ulysses, --ring), which keeps no K/V")
