"""The tensor splits's styles as torch ParallelStyles, their collectives counted in the byte ledger.

| style              | weight        | output of the module                                        |
|--------------------|---------------|-------------------------------------------------------------|
| colwise            | Shard(0)      | this rank's output features (..., out/p), left split        |
| packed_colwise     | Shard(0) by block | as colwise; the output rows split block by block        |
| rowwise            | Shard(1)      | the partial sums, all-reduced through `Comm` ("tp_all_reduce") |
| packed_rowwise     | Shard(1) by block | as rowwise; the input columns split block by block     |
| colwise_gathered   | Shard(0)      | (..., out/p) all-gathered back to (..., out) ("tp_all_gather") |

Every rank holds the same full weights before the split (all ranks load the same files, or build the same
seeded preset), so each keeps its own slice (`src_data_rank=None`): splitting sends nothing. torch's
RowwiseParallel would all-reduce inside DTensor, where the ledger cannot see it; here it leaves the output
`Partial` and genbatch's `Comm` reduces it, so every byte TP sends is counted.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from genbatch.models.base import COLWISE, GATHERED_COLWISE, PACKED_COLWISE, PACKED_ROWWISE, ROWWISE
from genbatch.parallel.comm import Comm
from genbatch.parallel.marks import ModuleMark

SHARDS: ModuleMark[dict] = ModuleMark("tp shards")
"""What a split module records: parameter name -> (dim, block sizes) of its tp split, or None for a
parameter every rank keeps whole (`genbatch.parallel.tensor.loading` reads it)."""
SPLIT_OVER: ModuleMark[tuple[int, int]] = ModuleMark("tp split rank")
"""What a split module records of its group: (this rank's index, the group's size); the tp axis for a
transformer, the job group for a text encoder (`genbatch.parallel.lora` takes its parts by it)."""


def block_slice(full: torch.Tensor, dim: int, blocks: list[int], rank: int, size: int) -> torch.Tensor:
    """This rank's part of `full` along `dim`: each block of `blocks` (sizes summing to the dim) split in `size`
    equal parts, the rank's parts concatenated. One block is a plain even split."""
    parts, offset = [], 0
    for block in blocks:
        chunk = block // size
        parts.append(full.narrow(dim, offset + rank * chunk, chunk))
        offset += block
    # (..., sum(blocks), ...) -> (..., sum(blocks) / size, ...) along `dim`
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)).contiguous()


def packed_blocks(linear: torch.nn.Linear) -> list[int]:
    """The input-column blocks of a packed row-wise Linear: its `_tp_packed_row_blocks` (diffusers sets them on
    FLUX's single-stream `proj_out`), else [out_features, the rest] (attention output, then the MLP branch, as
    HunyuanVideo's single-stream block concatenates them)."""
    blocks = getattr(linear, "_tp_packed_row_blocks", None)
    return list(blocks) if blocks else [linear.out_features, linear.in_features - linear.out_features]


def packed_col_blocks(linear: torch.nn.Linear) -> list[int]:
    """The output-row blocks of a packed column-wise Linear: its `_tp_packed_col_blocks` (diffusers sets them on
    FLUX.2's single-stream `to_qkv_mlp_proj`: q, k, v, the MLP's gate and up), else two equal halves (a gated
    MLP's fused [gate, up] input projection, as diffusers' `PackedColwiseParallel([1, 1])` splits it)."""
    blocks = getattr(linear, "_tp_packed_col_blocks", None)
    if blocks:
        return list(blocks)
    if linear.out_features % 2:
        raise ValueError(f"a packed column-wise Linear of {linear.out_features} output features has no "
                         "_tp_packed_col_blocks and does not halve; list its blocks")
    return [linear.out_features // 2] * 2


def split_sizes(style: str, linear: torch.nn.Module) -> dict[str, tuple[int, list[int]] | None]:
    """Parameter name -> (dim, blocks) of its split under `style` (None: kept whole). A column-wise Embedding
    (T5's relative position bias, one column per head) splits its columns."""
    if isinstance(linear, torch.nn.Embedding) and style == COLWISE:
        return {"weight": (1, [linear.embedding_dim])}
    out, width = linear.out_features, linear.in_features
    if style in (COLWISE, GATHERED_COLWISE):
        shards = {"weight": (0, [out]), "bias": (0, [out])}
    elif style == PACKED_COLWISE:
        blocks = packed_col_blocks(linear)
        shards = {"weight": (0, blocks), "bias": (0, blocks)}
    elif style == ROWWISE:
        shards = {"weight": (1, [width]), "bias": None}
    elif style == PACKED_ROWWISE:
        shards = {"weight": (1, packed_blocks(linear)), "bias": None}
    else:
        raise ValueError(f"{style!r} is not a Linear's tensor-parallel style ({COLWISE}, {ROWWISE}, "
                         f"{PACKED_COLWISE}, {PACKED_ROWWISE}, {GATHERED_COLWISE})")
    return {name: shard for name, shard in shards.items() if getattr(linear, name, None) is not None}


class _PackedRowwise(RowwiseParallel):
    """RowwiseParallel whose weight columns are split block by block (the input concatenates column-split
    streams); the local weight is labelled Shard(1), which is what the local matmul needs."""

    def _partition_linear_fn(self, name, module, device_mesh):
        rank, size = device_mesh.get_local_rank(), device_mesh.size()
        local = block_slice(module.weight.detach(), 1, packed_blocks(module), rank, size)
        module.register_parameter("weight", torch.nn.Parameter(
            DTensor.from_local(local, device_mesh, [Shard(1)], run_check=False), requires_grad=False))
        if module.bias is not None:
            whole = distribute_tensor(module.bias.detach(), device_mesh, [Replicate()], src_data_rank=None)
            module.register_parameter("bias", torch.nn.Parameter(whole, requires_grad=False))


class _PackedColwise(ColwiseParallel):
    """ColwiseParallel whose weight (and bias) rows are split block by block (the output packs several streams);
    the local rows are labelled Shard(0), which is what the local matmul needs."""

    def _partition_linear_fn(self, name, module, device_mesh):
        rank, size = device_mesh.get_local_rank(), device_mesh.size()
        blocks = packed_col_blocks(module)
        for param_name in ("weight", "bias"):
            param = getattr(module, param_name, None)
            if param is not None:
                local = block_slice(param.detach(), 0, blocks, rank, size)
                module.register_parameter(param_name, torch.nn.Parameter(
                    DTensor.from_local(local, device_mesh, [Shard(0)], run_check=False), requires_grad=False))


def _torch_style(style: str):
    if style in (COLWISE, GATHERED_COLWISE):
        chosen = ColwiseParallel()
    elif style == PACKED_COLWISE:
        chosen = _PackedColwise()
    elif style == ROWWISE:
        chosen = RowwiseParallel(output_layouts=Partial())
    else:
        chosen = _PackedRowwise(output_layouts=Partial())
    chosen.src_data_rank = None  # every rank keeps its slice of its own (identical) full copy
    return chosen


def gather_last(comm: Comm, local: torch.Tensor) -> torch.Tensor:
    """(..., k) on each of p ranks -> (..., p k), the ranks' parts in rank order."""
    gathered = local.new_empty((comm.size, *local.shape))
    comm.all_gather_into(gathered, local.unsqueeze(0), kind="tp_all_gather")  # p x (1, ..., k) -> (p, ..., k)
    return gathered.movedim(0, -2).flatten(-2)  # (p, ..., k) -> (..., p, k) -> (..., p k)


def apply_style(linear: torch.nn.Linear, style: str, mesh, comm: Comm) -> None:
    """Split `linear` over the tp `mesh` by `style`, its output collective through `comm`."""
    shards = split_sizes(style, linear)
    parallelize_module(linear, mesh, _torch_style(style))
    SHARDS.put(linear, shards)
    SPLIT_OVER.put(linear, (comm.rank, comm.size))
    if style in (ROWWISE, PACKED_ROWWISE):
        linear.register_forward_hook(lambda module, args, output: comm.all_reduce(output, kind="tp_all_reduce"))
    elif style == GATHERED_COLWISE:
        linear.register_forward_hook(lambda module, args, output: gather_last(comm, output))
