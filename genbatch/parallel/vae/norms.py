"""GroupNorm over a whole image whose tiles live on different ranks.

Each rank computes, per (sample, group), its element count, mean and sum of squared deviations (M2) in
fp32; one all-gather of these few numbers per norm layer and Chan's pairwise formula (in fp64) give the
statistics of the whole image, free of the cancellation that plain sums of squares suffer. Each rank then
normalises its own tile with them.
"""

from __future__ import annotations

import torch
from torch import nn

from genbatch.parallel.vae.context import TileGroup


def _global_stats(group: TileGroup, xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance per (sample, group) over every rank's tile; `xg` is (n, groups, elements) in fp32."""
    var, mean = torch.var_mean(xg, dim=-1, unbiased=False)
    count = torch.full_like(mean, float(xg.shape[-1]), dtype=torch.float64)
    # (3, n, groups): count, mean, M2 of this tile
    local = torch.stack([count, mean.double(), var.double() * count])
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
    groups = norm.num_groups
    # (n, c, ...) -> (n, groups, c / groups * ...)
    xg = x.reshape(n, groups, -1).float()
    mean, var = _global_stats(group, xg)
    rstd = torch.rsqrt(var + norm.eps)
    out = xg - mean.unsqueeze(-1)
    out.mul_(rstd.unsqueeze(-1))
    # (n, groups, c / groups * ...) -> (n, c, ...)
    out = out.view(n, channels, -1)
    if norm.affine:
        out.mul_(norm.weight.float().view(1, channels, 1)).add_(norm.bias.float().view(1, channels, 1))
    return out.view(x.shape).to(x.dtype)
