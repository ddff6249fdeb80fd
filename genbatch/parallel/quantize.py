"""Weight quantization (`--quantization fp8|int8`, `--quantize-text-encoder`): torchao's `quantize_` on the
Linear layers of the denoisers and, when asked, of the text encoders; the VAE, the norms, the embeddings and the
layers a model keeps in fp32 (`_keep_in_fp32_modules`) stay in their dtype.

    int8   Int8WeightOnlyConfig: int8 weights, one scale per output row, dequantized into each matmul
    fp8    on a GPU with FP8 GEMMs (compute capability 8.9 or more: Ada, Hopper, Blackwell):
           Float8DynamicActivationFloat8WeightConfig, e4m3 weights per row and each activation scaled as it
           comes, so the matmul runs on the FP8 tensor cores; a layer whose sides do not divide by 16 (what
           `torch._scaled_mm` takes) gets the weight-only form instead
           elsewhere (older GPUs, the CPU): Float8WeightOnlyConfig, e4m3 weights per row, dequantized into
           each matmul (memory, not speed); on the CPU a block of rows at a time (`parallel/row_blocks.py`)

Applied in the parallelisation order after the stage split and the plans (each PipeFusion stage quantizes only
the blocks it kept) and before compile, which traces through the quantized matmuls (`parallel/apply.py`). Every
targeted layer must come out quantized: a layer torchao leaves as it was fails the run at start-up, never a
flag that silently does nothing (`quantize`). torchao's tensors (`Int8Tensor`, `Float8Tensor`) neither split
under DTensor nor shard under `fully_shard` (torchao 0.18: no `aten.split`/`aten.view`/`aten.new_zeros` for
them), so `--tp` and `--fsdp` are refused beside a quantization by the axis table's rules
(`parallel/axes.layout_problems`), for the runner and the planner alike.

The run's setting is `genbatch.jobs.quantization.Quantization`. From a pipeline directory each Linear is quantized
as soon as its weight is read (`as_filled`, called by `fill_from_safetensors`), a block of rows at a time, so the
model is never whole at the run's dtype. A quantized weight keeps its parameter object: a LoRA switch (`parallel/lora.py`) writes base + delta into it in
place by quantizing the sum again (`requantize_into`) and puts the kept quantized base back bit for bit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from genbatch.parallel.marks import ModuleMark

if TYPE_CHECKING:
    import torch

FP8_GEMM_CAPABILITY = (8, 9)
"""The CUDA compute capability from which GPUs run FP8 GEMMs (Ada Lovelace; Hopper is 9.0)."""
_SCALED_MM_MULTIPLE = 16
"""`torch._scaled_mm` takes matrices whose sides divide by 16."""
CHUNK_VALUES = 2**18
"""A weight of more values than this is quantized a block of rows at a time: torchao's quantization of a whole
14M-value weight raised the process's peak by 110 MB (int8) and 210 MB (fp8) of temporaries (fp32 copies,
absolute values, rounding), by 13 and 33 MB in blocks of 2**18 values, on the CPU. Rows scale apart (one scale a
row), so the blocks give the same data and scales as the whole."""

CONFIGS: ModuleMark[object] = ModuleMark("quantized linear")
"""The torchao config each quantized Linear was quantized with (what a LoRA switch quantizes its sum with)."""


TORCHAO_IMPORT_LOGGERS = ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer")
"""Loggers that speak when torchao is imported (diffusers imports it whenever it is installed): its CUDA-only
extensions that fail to load on a CPU, its enums registered with torch's pytree, and diffusers' note about
checkpoints serialized with torchao. All harmless for genbatch, which quantizes at load."""


def quiet_torchao_import() -> None:
    """Keep the warnings of torchao's import (`TORCHAO_IMPORT_LOGGERS`) out of a run's output (errors still
    show); `gen run` calls it before it imports diffusers."""
    for name in TORCHAO_IMPORT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _torchao():
    """torchao's quantization API, imported quietly."""
    quiet_torchao_import()
    import torchao.quantization as api

    return api


def fp8_gemms(device: torch.device) -> bool:
    """True when `device` runs FP8 GEMMs (a CUDA GPU of compute capability 8.9 or more)."""
    import torch

    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_GEMM_CAPABILITY


def method(kind: str, device: torch.device) -> str:
    """What `kind` runs as on `device`: `fp8 dynamic` (FP8 GEMMs), `fp8 weight-only`, `int8 weight-only`."""
    if kind == "fp8" and fp8_gemms(device):
        return "fp8 dynamic"
    return f"{kind} weight-only"


def _config(kind: str, device: torch.device, linear: torch.nn.Linear):
    """The torchao config for one Linear."""
    import torch

    api = _torchao()
    if kind == "int8":
        return api.Int8WeightOnlyConfig()
    sides = (linear.in_features, linear.out_features)
    if fp8_gemms(device) and all(side % _SCALED_MM_MULTIPLE == 0 for side in sides):
        granularity = api.PerRow() if linear.weight.dtype == torch.bfloat16 else api.PerTensor()
        return api.Float8DynamicActivationFloat8WeightConfig(granularity=granularity)
    return api.Float8WeightOnlyConfig()


def kept_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The name parts whose modules a model keeps in fp32 under bf16 weights: diffusers' `_keep_in_fp32_modules`,
    transformers' `_keep_in_fp32_modules_strict` (its `_keep_in_fp32_modules`, T5's `wo`, apply to fp16 alone).
    Precision-sensitive, so never quantized, whatever the run's dtype."""
    if hasattr(module, "_keep_in_fp32_modules_strict"):  # a transformers model
        return tuple(sorted(module._keep_in_fp32_modules_strict or ()))
    return tuple(sorted(getattr(module, "_keep_in_fp32_modules", None) or ()))


def targets(module: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """(name, Linear) of every layer `quantize` quantizes in `module`: each `torch.nn.Linear` with a 2-D weight,
    except those under a module the model keeps in fp32 (matched as diffusers matches them: by name part)."""
    import torch

    kept = kept_names(module)
    found = []
    for name, sub in module.named_modules():
        if not isinstance(sub, torch.nn.Linear) or sub.weight is None or sub.weight.dim() != 2:
            continue
        if any(part in kept for part in name.split(".")):
            continue
        found.append((name, sub))
    return found


def is_quantized(tensor) -> bool:
    """True for a torchao quantized tensor (a parameter's data after `quantize`); torchao is imported only for a
    tensor of its own."""
    if tensor is None or not type(tensor).__module__.startswith("torchao"):
        return False
    from torchao.utils import TorchAOBaseTensor

    return isinstance(tensor, TorchAOBaseTensor)


def _data_tensors(tensor) -> list:
    """The plain tensors a torchao tensor stores (its quantized data, scales, zero points)."""
    names = [*type(tensor).tensor_data_names, *getattr(type(tensor), "optional_tensor_data_names", ())]
    return [value for value in (getattr(tensor, name, None) for name in names) if value is not None]


def tensor_bytes(tensor) -> int:
    """Bytes `tensor` holds on this rank: a DTensor's local part, a quantized tensor's stored data and scales."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    if is_quantized(tensor):
        return sum(tensor_bytes(part) for part in _data_tensors(tensor))
    return tensor.numel() * tensor.element_size()


def weight_bytes(module: torch.nn.Module | None) -> int:
    """Bytes of `module`'s parameters on this rank, as loaded (quantized weights at their stored width)."""
    if module is None:
        return 0
    return sum(tensor_bytes(param) for param in module.parameters())


def _quantized(values: torch.Tensor, config):
    """`values` (a weight, out x in) as torchao's tensor under `config`."""
    import torch

    holder = torch.nn.Linear(values.shape[1], values.shape[0], bias=False, device="meta")
    holder.weight = torch.nn.Parameter(values, requires_grad=False)
    _torchao().quantize_(holder, config)
    return holder.weight


def _quantized_by_rows(weight: torch.Tensor, config):
    """`weight` quantized a block of rows at a time (`CHUNK_VALUES`), the blocks' data and scales joined into one
    tensor of torchao's class; None when its scales are not one a row (a per-tensor scale spans the blocks)."""
    import torch

    rows = max(1, CHUNK_VALUES // weight.shape[1])
    first = _quantized(weight[:rows].clone(), config)
    names, context = first.__tensor_flatten__()
    parts = {name: getattr(first, name) for name in names}
    if any(part.dim() == 0 or part.shape[0] != first.shape[0] for part in parts.values()):
        return None
    whole = {name: part.new_empty((weight.shape[0], *part.shape[1:])) for name, part in parts.items()}
    for start in range(0, weight.shape[0], rows):
        block = first if start == 0 else _quantized(weight[start:start + rows].clone(), config)
        for name in names:
            whole[name][start:start + block.shape[0]].copy_(getattr(block, name))
    return type(first).__tensor_unflatten__(whole, context, torch.Size(weight.shape), None)


def _quantize_layer(linear: torch.nn.Linear, kind: str, device: torch.device) -> None:
    import torch

    config = _config(kind, device, linear)
    weight = linear.weight.detach()
    quantized = _quantized_by_rows(weight, config) if weight.numel() > CHUNK_VALUES else None
    if quantized is None:
        _torchao().quantize_(linear, config, filter_fn=lambda sub, fqn: sub is linear)
    else:
        linear.weight = torch.nn.Parameter(quantized, requires_grad=False)
    CONFIGS.put(linear, config)
    if device.type == "cpu" and isinstance(config, _torchao().Float8WeightOnlyConfig):
        from genbatch.parallel.row_blocks import use_row_blocks

        use_row_blocks(linear)  # its matmul dequantizes a block of rows at a time, not the whole weight


def quantize(module: torch.nn.Module, kind: str, device: torch.device) -> int:
    """Quantize `module`'s `targets` in place to `kind` (fp8, int8) for `device` (those `as_filled` quantized
    already are left as they are); the number of targeted layers. RuntimeError naming the layers when torchao
    left any of them unquantized (a flag never silently does nothing)."""
    import torch

    layers = targets(module)
    for name, linear in layers:
        if not is_quantized(linear.weight):
            _quantize_layer(linear, kind, device)
    missed = [name for name, linear in layers if not is_quantized(linear.weight)]
    if missed:
        raise RuntimeError(f"--quantization {kind}: torchao left {len(missed)} Linear layer(s) of "
                           f"{type(module).__name__} unquantized (first: {', '.join(missed[:3])}); run with "
                           "--quantization none, or report the layer's shape")
    torch.nn.Module.eval(module)
    return len(layers)


def as_filled(module: torch.nn.Module, kind: str, device: torch.device, after=None):
    """A `filled(name)` callback for `fill_from_safetensors` that quantizes each targeted Linear as soon as its
    weight is read (its bias, if any, read before or after), so the whole model never sits in memory at the
    run's dtype: the peak is the quantized model plus one layer. `after()`, when given, runs after each layer
    (the runner gives the freed high-precision weight back to the system: `runner.loading`)."""
    pending = {f"{name}.weight" if name else "weight": linear for name, linear in targets(module)}

    def filled(name: str) -> None:
        linear = pending.pop(name, None)
        if linear is not None:
            _quantize_layer(linear, kind, device)
            if after is not None:
                after()

    return filled


def requantize_into(linear: torch.nn.Linear, values: torch.Tensor) -> None:
    """Write `values` (the whole weight this rank holds, high precision) into `linear`'s quantized weight in
    place: quantized with the layer's own config, then copied into the same parameter (its data and scales)."""
    import torch

    config = CONFIGS.get(linear)
    if config is None:
        raise RuntimeError(f"{type(linear).__name__} holds a quantized weight genbatch did not quantize")
    values = values.to(linear.weight.dtype)
    quantized = (_quantized_by_rows(values, config) if values.numel() > CHUNK_VALUES else None)
    with torch.no_grad():
        linear.weight.copy_(quantized if quantized is not None else _quantized(values, config))


__all__ = ["CONFIGS", "as_filled", "fp8_gemms", "is_quantized", "method", "quantize", "requantize_into",
           "targets", "tensor_bytes", "weight_bytes"]
