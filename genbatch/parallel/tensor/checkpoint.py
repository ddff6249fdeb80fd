"""Filling a tensor-parallel skeleton from a component's safetensors, each rank reading only its own part.

    fill_from_safetensors(model, folder, dtype, device, keep_fp32=model._keep_in_fp32_modules)

`model` was built with its parameters on the meta device (buffers computed at construction) and then split by
its tensor splits (`genbatch.parallel.tensor.shard`); `folder` is the component's folder of a diffusers pipeline
directory (`<pipeline>/transformer`): one safetensors file, or several named by a `.safetensors.index.json`.
Every parameter is read with `safe_open(...).get_slice(name)[...]`: a split one only this rank's block of rows
or columns (`tp_split`; a packed row-wise split one block per packed part), the rest whole; each goes straight
to `device` in its load dtype, so no rank ever holds a full copy of a split tensor. The load dtype is the one
diffusers' `from_pretrained(torch_dtype=dtype)` gives: floating tensors in `dtype` except those under a
`_keep_in_fp32_modules` name (fp32), others as stored. Persistent buffers the files hold are read whole; those
computed at construction move to `device`.

A transformers model's files may name its tensors otherwise than its modules do (Qwen2.5-VL saves its language
model's `model.language_model.*` as `model.*`): `checkpoint_names` maps each module name to its key by the
renaming transformers' own `from_pretrained` applies (`conversion_mapping.get_model_conversion_mapping`, each key
through `core_model_loading.rename_source_key`). A tensor transformers converts on loading (fuses, chunks,
transposes) is no single slice of one stored tensor: it counts as missing, and `missing_from` lists it.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.distributed.tensor import DTensor

from genbatch.parallel.tensor.loading import tp_split

RELEASE_BYTES = 16 * 2**20
"""With a `filled` callback (each layer quantized as it is read), the files are closed and reopened after this many
bytes are read: a safetensors file is read through a memory mapping, whose pages stay resident in the process
until it is closed, and the whole file's pages would otherwise add to the load's peak."""

WEIGHT_NAMES = ("diffusion_pytorch_model.safetensors", "model.safetensors")
"""The weight file names diffusers and transformers save (each may instead be sharded under an index)."""


def weight_map(folder: str) -> dict[str, str]:
    """Tensor name -> the safetensors file (a path) holding it, for a component's folder."""
    for name in WEIGHT_NAMES:
        index = os.path.join(folder, f"{name}.index.json")
        if os.path.exists(index):
            with open(index, encoding="utf-8") as handle:
                files = json.load(handle)["weight_map"]
            return {tensor: os.path.join(folder, file) for tensor, file in files.items()}
        single = os.path.join(folder, name)
        if os.path.exists(single):
            from safetensors import safe_open

            with safe_open(single, framework="pt") as handle:
                return dict.fromkeys(handle.keys(), single)
    raise ValueError(f"{folder} holds no {' or '.join(WEIGHT_NAMES)} (nor an index of shards): tensor-parallel "
                     "loading reads safetensors; save the pipeline with save_pretrained(safe_serialization=True)")


def block_indices(shape: tuple[int, ...], dim: int, blocks: list[int], rank: int, size: int) -> list[tuple]:
    """The index tuples of this rank's part of a tensor of `shape` split along `dim` by `blocks` (each block cut
    in `size` equal parts, this rank's parts in block order): what `styles.block_slice` keeps, as slices."""
    indices, offset = [], 0
    for block in blocks:
        chunk = block // size
        start = offset + rank * chunk
        indices.append((slice(None),) * dim + (slice(start, start + chunk),) + (slice(None),) * (len(shape) - dim - 1))
        offset += block
    return indices


def read_part(handle, name: str, split: tuple[int, list[int]] | None, rank: int, size: int) -> torch.Tensor:
    """Tensor `name` of the open safetensors `handle`: whole when `split` is None, else this rank's blocks only."""
    if split is None or size == 1:
        return handle.get_tensor(name)
    dim, blocks = split
    part = handle.get_slice(name)
    shape = tuple(part.get_shape())
    pieces = [part[index] for index in block_indices(shape, dim, blocks, rank, size)]
    # (..., block / size, ...) per block -> (..., sum(blocks) / size, ...) along `dim`
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


def load_dtype(name: str, stored: torch.dtype, dtype: torch.dtype, keep_fp32: tuple[str, ...]) -> torch.dtype:
    """diffusers' rule: a floating tensor under a `_keep_in_fp32_modules` name part stays fp32, another floating
    tensor takes `dtype`, any other keeps its stored dtype."""
    if not stored.is_floating_point:
        return stored
    return torch.float32 if any(part in name.split(".") for part in keep_fp32) else dtype


def checkpoint_names(model: torch.nn.Module, keys) -> dict[str, str]:
    """Module tensor name -> the checkpoint key (of `keys`, a component's stored tensor names) that holds it: for
    a transformers model each key renamed as its `from_pretrained` renames it (the model's conversion mapping, its
    base model prefix added or stripped where the module names need it), a key transformers converts (a
    `WeightConverter`: fused, chunked, transposed) left out; for any other model each key is its own name."""
    modeling = sys.modules.get("transformers.modeling_utils")  # loaded wherever a transformers model exists
    if modeling is None or not isinstance(model, modeling.PreTrainedModel):
        from genbatch.parallel.pipeline.stages import stage_name  # a PipeFusion stage renumbers its blocks

        return {name: key for key in keys if (name := stage_name(model, key)) is not None}
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [entry for entry in transforms if isinstance(entry, WeightRenaming)]
    converters = [entry for entry in transforms if isinstance(entry, WeightConverter)]
    own = model.state_dict(keep_vars=True)  # module name -> tensor (meta or split: only the names are read)
    prefix = model.base_model_prefix
    names: dict[str, str] = {}
    for key in keys:
        name, converted = rename_source_key(key, renamings, converters, prefix, own)
        if name not in own and key in own:  # as transformers does: a key already in the module's layout
            name, converted = rename_source_key(key, [], [], prefix, own)
        if name in own and converted is None:
            names.setdefault(name, key)
    return names


class _Files:
    """The component's safetensors files, each opened once, on demand; tensors asked for by `model`'s names."""

    def __init__(self, folder: str, model: torch.nn.Module):
        self.folder = folder
        self.where = weight_map(folder)
        self.keys = checkpoint_names(model, self.where)
        self.open: dict[str, object] = {}
        self.read = 0
        """Bytes read since the files were last opened."""

    def release(self) -> None:
        """Close every open file (their mappings' pages leave the process); they reopen on demand."""
        self.open.clear()
        self.read = 0

    def handle(self, name: str) -> tuple[object, str]:
        """(the open file holding module tensor `name`, its key in that file)."""
        if name not in self.keys:
            raise ValueError(f"{self.folder}'s safetensors hold no tensor for {name!r}: the files do not match the "
                             "model class its config names; save the pipeline again with save_pretrained")
        key = self.keys[name]
        path = self.where[key]
        if path not in self.open:
            from safetensors import safe_open

            self.open[path] = safe_open(path, framework="pt")
        return self.open[path], key


def _copied(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` copied to `device` in `dtype`, contiguous in memory of its own: safetensors returns views of the
    file's mapping (a split part a view of the whole tensor), and a rank keeps neither the mapping nor a full
    split tensor alive."""
    return tensor.to(device=device, dtype=dtype, copy=True, memory_format=torch.contiguous_format)


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    owner, _, attribute = name.rpartition(".")
    return model.get_submodule(owner), attribute


@torch.no_grad()
def _fill_parameter(model, files: _Files, name: str, param, dtype, device, keep_fp32) -> None:
    split = tp_split(model, name)
    mesh = param.device_mesh if isinstance(param, DTensor) else None
    rank, size = (mesh.get_local_rank(), mesh.size()) if mesh is not None else (0, 1)
    raw = read_part(*files.handle(name), split if mesh is not None else None, rank, size)
    files.read += raw.numel() * raw.element_size()
    local = _copied(raw, device, load_dtype(name, raw.dtype, dtype, keep_fp32))
    expected = param.to_local().shape if mesh is not None else param.shape
    if local.shape != expected:
        raise ValueError(f"{files.folder}: {name} reads as {tuple(local.shape)} on tp rank {rank} of {size}, the "
                         f"split model expects {tuple(expected)}; the checkpoint does not match its config")
    value = DTensor.from_local(local, mesh, param.placements, run_check=False, shape=param.shape,
                               stride=param.stride()) if mesh is not None else local
    owner, attribute = _owner(model, name)
    owner.register_parameter(attribute, torch.nn.Parameter(value, requires_grad=param.requires_grad))


def tied_targets(model: torch.nn.Module) -> set[str]:
    """Parameters a transformers model ties to another (`all_tied_weights_keys`: target -> source), which its
    checkpoint may leave out; `tie_weights` points them at their source after loading."""
    return set(getattr(model, "all_tied_weights_keys", None) or {})


def missing_from(model: torch.nn.Module, folder: str) -> list[str]:
    """`model`'s parameters (tied ones aside) that `folder`'s safetensors hold under no key `checkpoint_names`
    maps to them (a tensor transformers converts on loading; all of them when the folder holds no safetensors)."""
    try:
        held = checkpoint_names(model, weight_map(folder))
    except ValueError:  # other weight files (.bin): from_pretrained reads them
        held = {}
    tied = tied_targets(model)
    return [name for name, _ in model.named_parameters() if name not in held and name not in tied]


def whole_load_reason(model: torch.nn.Module, folder: str) -> str | None:
    """Why `model` cannot be filled in parts from `folder` (it then loads whole through `from_pretrained`, every
    rank reading every weight, and is split afterwards); None when every parameter can be."""
    try:
        weight_map(folder)
    except ValueError:
        return (f"{folder} holds no safetensors (its weights are in other files, such as .bin); save the pipeline "
                "with save_pretrained(safe_serialization=True) for each rank to read only its part")
    missing = missing_from(model, folder)
    if not missing:
        return None
    return (f"{folder}'s safetensors hold {len(missing)} of its parameters ({missing[0]}, ...) in a form "
            "transformers converts on loading (fused, chunked or transposed), not as one stored tensor a rank can "
            "read its part of")


def fill_from_safetensors(model: torch.nn.Module, folder: str, dtype: torch.dtype, device: torch.device,
                          keep_fp32=(), filled=None) -> None:
    """Fill `model`'s meta parameters (and the persistent buffers `folder` holds) from `folder`'s safetensors,
    each rank reading only its part of every tensor-parallel split; `keep_fp32`: the module names loading keeps
    in fp32 (diffusers' `_keep_in_fp32_modules`). A transformers model's tied parameters the files leave out are
    tied again to their sources. `filled(name)`, when given, is called once each parameter is in place (the
    weight quantization takes each layer as it comes: `genbatch.parallel.quantize.as_filled`)."""
    files = _Files(folder, model)
    keep_fp32 = tuple(keep_fp32 or ())
    tied = tied_targets(model)
    for name, param in list(model.named_parameters()):
        if name in tied and name not in files.keys:
            continue
        _fill_parameter(model, files, name, param, dtype, device, keep_fp32)
        if filled is not None:
            filled(name)
            if files.read >= RELEASE_BYTES:
                files.release()
    if tied:
        model.tie_weights()
    for name, buffer in list(model.named_buffers()):
        owner, attribute = _owner(model, name)
        if name in files.keys:
            handle, key = files.handle(name)
            raw = handle.get_tensor(key)
            buffer = _copied(raw, device, load_dtype(name, raw.dtype, dtype, keep_fp32))
        elif buffer.is_meta:
            raise ValueError(f"{files.folder}: buffer {name} is neither in the checkpoint nor computed when the "
                             "model is built; load this model without --tp")
        owner._buffers[attribute] = buffer.to(device)
