"""Wan's QK RMSNorm across heads, on a tp shard of the heads.

Wan normalises q and k over all heads' channels at once (`qk_norm="rms_norm_across_heads"`: one
`torch.nn.RMSNorm(heads x head_dim)` before the heads are split). Under tp each rank holds heads/p of them, so
its local mean square is not the row's: without the all-reduce of the sum of squares over tp the output is
silently wrong. One all-reduce of (..., 1) values per norm call, counted as "tp_norm".
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard

from genbatch.parallel.comm import Comm
from genbatch.parallel.tensor.styles import SHARDS, block_slice


class HeadShardedRMSNorm(torch.nn.Module):
    """`torch.nn.RMSNorm(c)` over channels split in `comm.size` parts: x * rsqrt(mean(x^2) + eps) * weight,
    the mean taken over all c channels of the group. The weight is a Shard(0) DTensor over the tp `mesh`, as
    the split Linears' are (its global shape is the checkpoint's)."""

    def __init__(self, norm: torch.nn.RMSNorm, comm: Comm, mesh):
        super().__init__()
        (self.width,) = norm.normalized_shape
        if self.width % comm.size:
            raise ValueError(f"an RMSNorm over {self.width} channels cannot split over --tp {comm.size}; "
                             "choose a --tp that divides the head count")
        self.eps = norm.eps
        self.comm = comm
        self.weight = None
        if norm.weight is not None:
            local = block_slice(norm.weight.detach(), 0, [self.width], comm.rank, comm.size)
            split = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            self.weight = torch.nn.Parameter(split, requires_grad=False)
        SHARDS.put(self, {"weight": (0, [self.width])} if norm.weight is not None else {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computed in fp32 as torch's rms_norm does for lower precisions, then cast back before the weight
        upcast = x.float()
        squares = upcast.pow(2).sum(dim=-1, keepdim=True)  # (..., c/p) -> (..., 1)
        self.comm.all_reduce(squares, kind="tp_norm")
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        normed = (upcast * torch.rsqrt(squares / self.width + eps)).to(x.dtype)
        return normed * self.weight.to_local() if self.weight is not None else normed
