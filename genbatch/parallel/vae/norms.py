"""GroupNorm over a whole image whose tiles live on different ranks.

Each rank computes, per (sample, group), its element count, mean and sum of squared deviations from that
mean (M2), in fp32; one all-gather of these few numbers per norm layer and Chan's pairwise formula (in
fp64) give the statistics of the whole image, free of the cancellation that plain sums of squares suffer
when the mean is large. Each rank then normalises its own tile with them in one native pass (batch norm in
eval mode, fed the global statistics per channel), which keeps fp32 arithmetic for bf16/fp16 tiles too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genbatch.parallel.vae.context import TileGroup

_CHUNKS = 8
"""The deviations are squared a few groups at a time: the temporary is at most 1/_CHUNKS of the tile (fp32)."""


def _local_stats(xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and M2 per (sample, group) of `xg` (n, groups, elements), in fp32."""
    mean = xg.mean(dim=-1, dtype=torch.float32)
    m2 = torch.empty_like(mean)
    step = max(1, xg.shape[1] // _CHUNKS)
    for start in range(0, xg.shape[1], step):
        deviations = xg[:, start : start + step].float() - mean[:, start : start + step, None]
        m2[:, start : start + step] = torch.linalg.vector_norm(deviations, dim=-1).square()
    return mean, m2


def _global_stats(group: TileGroup, xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance per (sample, group) over every rank's tile; `xg` is this tile, (n, groups, elements)."""
    mean, m2 = _local_stats(xg)
    count = torch.full_like(mean, float(xg.shape[-1]), dtype=torch.float64)
    # (3, n, groups): count, mean, M2 of this tile
    local = torch.stack([count, mean.double(), m2.double()])
    gathered = local.new_empty((group.comm.size * 3, *local.shape[1:]))
    group.comm.all_gather_into(gathered, local)
    # (p * 3, n, groups) -> (p, 3, n, groups)
    counts, means, m2s = gathered.view(group.comm.size, 3, *local.shape[1:]).unbind(1)
    total = counts.sum(0)
    mean_all = (counts * means).sum(0) / total
    m2_all = m2s.sum(0) + (counts * (means - mean_all) ** 2).sum(0)
    return mean_all.float(), (m2_all / total).float()


def group_norm(group: TileGroup, norm: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)` as if over the whole image, for this rank's tile `x` of shape (n, c, ...)."""
    n, channels = x.shape[:2]
    per_group = channels // norm.num_groups
    # (n, c, ...) -> (n, groups, c / groups * ...)
    mean, var = _global_stats(group, x.reshape(n, norm.num_groups, -1))
    # (n, groups) -> (n * c,): the statistics of each channel's group, for batch norm's per-channel slots
    mean = mean.repeat_interleave(per_group, dim=1).reshape(-1)
    var = var.repeat_interleave(per_group, dim=1).reshape(-1)
    weight = norm.weight.float().repeat(n) if norm.affine else None
    bias = norm.bias.float().repeat(n) if norm.affine else None
    # (n, c, ...) -> (1, n * c, ...): one batch-norm channel per (sample, channel)
    out = F.batch_norm(x.reshape(1, n * channels, -1), mean, var, weight, bias, False, 0.0, norm.eps)
    return out.view(x.shape)
