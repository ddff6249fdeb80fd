"""LoRA deltas merged into a pipeline's weights where they live, each rank merging only its own part.

A LoRA layer on a Linear of weight W (out, in) is W + s * B @ A, with A (r, in), B (out, r) and s the
adapter's scale times its alpha / r. A rank holds some part of W: all of it; a tp split (rows for column-wise,
column blocks for row-wise and packed row-wise, `genbatch.parallel.tensor.styles`); the FSDP shard of that
(a chunk of its rows); or nothing, a block of another PipeFusion stage. The part of B @ A on those rows and
columns is B's rows @ A's columns, so each rank multiplies the slices of its own part and never forms a whole
delta of a sharded weight (`local_factors`).

`LoraWeights` switches a pipeline between adapter sets in place: before a weight first changes, the part of
it this rank holds is kept on the host, and every switch writes base + the new set's deltas over it (never
`W - delta`), so a job with no adapter after one with an adapter gets the base weights bit for bit, and
compiled code (whose guards see the same parameter objects) recompiles nothing.

Quantized weights (`--quantization fp8|int8`, `genbatch.parallel.quantize`) take the deltas the same way, merged
into their dequantized values: the fp32 sum starts from the dequantized base, and the sum is quantized again with
the layer's own config and written into the same parameter (its data and scales), so the model stays at its
quantized width and the delta is rounded with it. The base kept on the host is the quantized tensor itself, so
switching back to no adapter restores it bit for bit. (Running the factors beside the quantized weights, as an
extra B(Ax) per layer, would keep the delta exact but cost two small matmuls a layer every step.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from genbatch.parallel.fsdp import fsdp_part
from genbatch.parallel.pipeline.stages import stage_name
from genbatch.parallel.quantize import is_quantized, requantize_into, tensor_bytes
from genbatch.parallel.tensor.loading import tp_split
from genbatch.parallel.tensor.styles import SPLIT_OVER, block_slice


@dataclass(frozen=True, slots=True)
class LoraLayer:
    """One adapted Linear of one pipeline component, in the component's whole-model names."""

    component: str
    """The pipeline attribute (`transformer`, `text_encoder`, ...)."""
    module: str
    """The Linear's path in the whole component (`blocks.0.attn1.to_q`)."""
    down: torch.Tensor
    """A (r, in)."""
    up: torch.Tensor
    """B (out, r)."""
    scale: float
    """The adapter's scale times alpha / r."""
    bias: torch.Tensor | None = None
    """A delta of the bias (out,), or None."""


def _fsdp_params(model: torch.nn.Module) -> set[int]:
    return {id(param) for sub in model.modules() if isinstance(sub, FSDPModule) for param in sub.parameters()}


def _fsdp_mesh_part(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The FSDP chunk of `tensor`'s rows that `param` (an FSDP-managed DTensor) holds: its mesh's first dim
    is the FSDP axis (a 2-D mesh puts tp after it)."""
    mesh = param.device_mesh
    if mesh.ndim == 1:
        return fsdp_part(tensor, mesh)
    rank, size = mesh.get_local_rank(0), mesh.size(0)
    chunks = torch.chunk(tensor, size, dim=0)
    return chunks[rank] if rank < len(chunks) else tensor[:0]


def local_factors(model: torch.nn.Module, module: str, up: torch.Tensor, down: torch.Tensor,
                  sharded: set[int]) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """(the Linear's name on this rank, B's rows, A's columns) for the part of `module.weight` this rank holds;
    None when it holds none of it (another PipeFusion stage's block). `sharded`: ids of the model's
    FSDP-managed parameters (`_fsdp_params`)."""
    local = stage_name(model, f"{module}.weight")
    if local is None:
        return None
    owner = local.rpartition(".")[0]
    param = model.get_parameter(local)
    split = tp_split(model, local)
    if split is not None:
        rank, size = SPLIT_OVER.get(model.get_submodule(owner), (0, 1))
        if size > 1:
            dim, blocks = split
            if dim == 0:  # column-wise: this rank's output rows
                up = block_slice(up, 0, blocks, rank, size)
            else:  # row-wise, packed row-wise: this rank's input columns, block by block
                down = block_slice(down, 1, blocks, rank, size)
    if id(param) in sharded:
        up = _fsdp_mesh_part(up, param)
    return owner, up, down


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _local_vector(model: torch.nn.Module, name: str, full: torch.Tensor, sharded: set[int]) -> torch.Tensor:
    """This rank's part of a full bias-sized tensor for parameter `name` (a local name)."""
    param = model.get_parameter(name)
    split = tp_split(model, name)
    if split is not None:
        rank, size = SPLIT_OVER.get(model.get_submodule(name.rpartition(".")[0]), (0, 1))
        if size > 1:
            full = block_slice(full, 0, split[1], rank, size)
    return _fsdp_mesh_part(full, param) if id(param) in sharded else full


class LoraWeights:
    """The adapter set merged into one pipeline now, and the base parts kept to undo it."""

    def __init__(self) -> None:
        self.active: object = None
        """The key of the set merged now (None: the base weights)."""
        self._base: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
        """(component, local parameter name) -> (the parameter's local tensor, its base values on the host)."""
        self._changed: set[tuple[str, str]] = set()
        self.elements = 0
        """Elements of the deltas this rank merged for the active set: its own parts only."""

    @property
    def kept_bytes(self) -> int:
        """Host bytes of the base parts kept (a quantized base at its stored width)."""
        return sum(tensor_bytes(base) for _, base in self._base.values())

    def _keep(self, key: tuple[str, str], local: torch.Tensor) -> torch.Tensor:
        if key not in self._base:  # a quantized tensor's `to` shares its data on the same device: clone it first
            kept = local.detach().clone().to("cpu") if is_quantized(local) else local.detach().to("cpu", copy=True)
            self._base[key] = (local, kept)
        return self._base[key][1]

    def _total(self, merged: dict, index: tuple[str, str], local: torch.Tensor) -> torch.Tensor:
        """The fp32 sum being built for one parameter: its base (kept on first use; a quantized one dequantized),
        then each delta added."""
        if index not in merged:
            base = self._keep(index, local)
            values = base.dequantize(torch.float32) if is_quantized(base) else base
            merged[index] = values.to(local.device, torch.float32, copy=True)
        return merged[index]

    @staticmethod
    def _write(pipe, index: tuple[str, str], local: torch.Tensor, value: torch.Tensor) -> None:
        """`value` into the parameter whose local tensor is `local`: copied, or quantized again into a quantized
        weight (its layer's own config)."""
        if is_quantized(local):
            component, name = index
            requantize_into(getattr(pipe, component).get_submodule(name.rpartition(".")[0]), value)
        else:
            local.copy_(value)

    @torch.no_grad()
    def switch(self, pipe, key: object, layers: Sequence[LoraLayer]) -> bool:
        """Make `pipe`'s weights base + `layers`' deltas (`key` names that set; () or None: the base); False
        when that set is merged already."""
        key = key or None
        if key == self.active:
            return False
        merged: dict[tuple[str, str], torch.Tensor] = {}  # the new weights, summed in fp32
        sharded: dict[str, set[int]] = {}
        for layer in layers:
            model = getattr(pipe, layer.component)
            fsdp = sharded.setdefault(layer.component, _fsdp_params(model))
            factors = local_factors(model, layer.module, layer.up, layer.down, fsdp)
            if factors is None:
                continue
            owner, up, down = factors
            name = f"{owner}.weight"
            local = _local(model.get_parameter(name))
            if (up.shape[0], down.shape[1]) != local.shape:
                raise RuntimeError(f"the LoRA part of {layer.component}.{name} is {(up.shape[0], down.shape[1])} but "
                                   f"this rank holds {tuple(local.shape)}")
            # W' = W + s B A in one fused pass over the fp32 sum (B (out, r) @ A (r, in))
            total = self._total(merged, (layer.component, name), local)
            total.addmm_(up.to(local.device, torch.float32), down.to(local.device, torch.float32), alpha=layer.scale)
            if layer.bias is not None:
                name = f"{owner}.bias"
                local = _local(model.get_parameter(name))
                delta = _local_vector(model, name, layer.bias.float(), fsdp)
                if delta.shape != local.shape:
                    raise RuntimeError(f"the LoRA part of {layer.component}.{name} is {tuple(delta.shape)} but this "
                                       f"rank holds {tuple(local.shape)}")
                self._total(merged, (layer.component, name), local).add_(delta.to(local.device), alpha=layer.scale)
        for index in self._changed - merged.keys():  # back to the base, exactly
            local, base = self._base[index]
            local.copy_(base)
        for index, value in merged.items():
            self._write(pipe, index, self._base[index][0], value)
        self._changed = set(merged)
        self.elements = sum(value.numel() for value in merged.values())
        self.active = key
        return True
