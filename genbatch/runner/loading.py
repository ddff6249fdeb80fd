"""Loading a model: a built-in preset, or a diffusers pipeline directory (a hub id's cached snapshot) through
`from_pretrained` (offline).

Weights go to this rank's device in the run's dtype; the VAE of video models stays in fp32 (as the Wan
reference code runs it). Under `--fsdp` the group leader alone reads the weights (`load_sharded_pipeline`);
under `--tp` from a directory each rank reads only its own shards (`load_tensor_parallel_pipeline`).
`PipelineCache` keeps the pipelines a process has loaded, by model name, and the bytes of each one's transformer
and text-encoder weights on this rank as loaded (`loaded_weights`: quantized weights at their stored width),
which run.json records per rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from genbatch.models.spec import ModelSpec
from genbatch.parallel.apply import shard_pipeline, sharded
from genbatch.parallel.config import ParallelizeConfig
from genbatch.parallel.context import ParallelContext
from genbatch.runner.presets import PRESETS, build_preset

LOG = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_dtype(device: torch.device) -> str:
    """bf16 on GPUs, fp32 on the CPU (CPU bf16 matmuls are slow and inexact)."""
    return "bf16" if device.type == "cuda" else "fp32"


def _quiet_loading() -> None:
    """Loading bars of diffusers/transformers would interleave with genbatch's own progress bar."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def _component_class(path: str, component: str) -> tuple[str, type]:
    """(library, class) of a pipeline directory's component, as its model_index.json names them."""
    import importlib
    import json
    import os

    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        library, class_name = json.load(handle)[component]
    return library, getattr(importlib.import_module(library), class_name)


def _meta_component(path: str, component: str, dtype: torch.dtype):
    """A pipeline directory's component built from its config on the meta device (no weights read)."""
    library, cls = _component_class(path, component)
    with torch.device("meta"):
        if library == "transformers":
            from transformers import AutoConfig

            module = cls(AutoConfig.from_pretrained(path, subfolder=component, local_files_only=True))
        else:
            module = cls.from_config(cls.load_config(path, subfolder=component, local_files_only=True))
    return module.to(dtype).eval()


def empty_component(path: str, component: str, dtype: torch.dtype):
    """A component built as its `from_pretrained` builds it before reading weights in `dtype`: parameters on the
    meta device, buffers computed on the CPU with `dtype` the default dtype."""
    from accelerate import init_empty_weights

    library, cls = _component_class(path, component)
    if library == "transformers":
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, subfolder=component, local_files_only=True)
        with init_empty_weights():
            return cls._from_config(config, dtype=dtype).eval()
    from diffusers.models.modeling_utils import no_init_weights

    config = cls.load_config(path, subfolder=component, local_files_only=True)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights(), init_empty_weights():
            module = cls.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return module.eval()


def keep_in_fp32(module: torch.nn.Module, dtype: torch.dtype) -> tuple[str, ...]:
    """The module names `from_pretrained` keeps in fp32 when loading `module`'s class in `dtype`: diffusers'
    `_keep_in_fp32_modules`; transformers' `_keep_in_fp32_modules_strict` under fp16 and bf16, and its
    `_keep_in_fp32_modules` under fp16 only."""
    if not hasattr(module, "_keep_in_fp32_modules_strict"):  # a diffusers model
        return tuple(getattr(module, "_keep_in_fp32_modules", None) or ())
    names = set(module._keep_in_fp32_modules_strict or ()) if dtype in (torch.float16, torch.bfloat16) else set()
    return tuple(names | (set(module._keep_in_fp32_modules or ()) if dtype == torch.float16 else set()))


def _split_encoders(path: str, ctx: ParallelContext, dtype: torch.dtype, requested: str) -> dict:
    """The text encoders `--text-encoder-parallel` (`requested`) splits over the job group whose safetensors hold
    every parameter as one stored tensor (under the module's name or one transformers renames to it), built
    empty by name. The others it splits load whole, then split: a warning (rank 0) says which and why."""
    import json
    import os

    from genbatch.parallel.apply import TEXT_ENCODERS
    from genbatch.parallel.tensor import encoders
    from genbatch.parallel.tensor.checkpoint import whole_load_reason

    if ctx.group.size == 1:
        return {}
    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        index = json.load(handle)
    built = {}
    for name in TEXT_ENCODERS:
        if not (isinstance(index.get(name), list) and index[name][0] == "transformers"):
            continue
        module = empty_component(path, name, dtype)
        if not encoders.splits(requested, module, fsdp=ctx.dims.fsdp):
            continue
        reason = whole_load_reason(module, os.path.join(path, name))
        if reason is None:
            built[name] = module
        elif ctx.rank == 0:
            LOG.warning("genbatch: %s (%s) loads whole on every rank, then splits over the job group: %s", name,
                        type(module).__name__, reason)
    return built


def _cast(pipe, dtype: torch.dtype) -> None:
    """Cast a pipeline built in memory to `dtype`, keeping each model's `_keep_in_fp32_modules` in fp32
    (what `from_pretrained(torch_dtype=...)` does for pipelines loaded from a directory)."""
    for module in pipe.components.values():
        if not isinstance(module, torch.nn.Module):
            continue
        torch.nn.Module.to(module, dtype=dtype)
        keep = getattr(module, "_keep_in_fp32_modules", None) or []
        for name, child in module.named_modules():
            if name and any(part in name for part in keep):  # diffusers matches names by substring
                torch.nn.Module.to(child, dtype=torch.float32)


def load_skeleton(spec: ModelSpec, dtype: torch.dtype, meta: tuple[str, ...], build=_meta_component,
                  leave_out: tuple[str, ...] = ()):
    """The pipeline with the components named in `meta` built on the meta device (shapes, no weights); from a
    directory, `build(path, component, dtype)` builds them, and the components in `leave_out` are not loaded
    (None)."""
    _quiet_loading()
    if spec.name in PRESETS:
        pipe = build_preset(spec.name, meta=meta)
        _cast(pipe, dtype)
        return pipe
    import json
    import os

    from diffusers import DiffusionPipeline

    path = spec.path or spec.name  # a hub id loads from its cached snapshot
    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        index = json.load(handle)
    present = [name for name in meta if isinstance(index.get(name), list) and index[name][0] is not None]
    skeletons = {name: build(path, name, dtype) for name in present}
    skeletons.update({name: None for name in leave_out if name in index})
    return DiffusionPipeline.from_pretrained(path, dtype=dtype, local_files_only=True, **skeletons)


def finish_placement(pipe, spec: ModelSpec, device: torch.device, skip: tuple[str, ...] = ()):
    """Move the pipeline's modules (except `skip`) to `device`; the VAE of video models stays fp32."""
    for name, module in pipe.components.items():
        if isinstance(module, torch.nn.Module) and name not in skip:
            torch.nn.Module.to(module, device)
    if spec.is_video:
        torch.nn.Module.to(pipe.vae, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_pipeline(spec: ModelSpec, device: torch.device, dtype: torch.dtype):
    """Build or load the pipeline for `spec`, placed on `device` in `dtype` (VAE of video models in fp32)."""
    return finish_placement(load_skeleton(spec, dtype, meta=()), spec, device)


def load_sharded_pipeline(spec: ModelSpec, ctx: ParallelContext, dtype: torch.dtype,
                          config: ParallelizeConfig = ParallelizeConfig()):
    """`--fsdp` loading: the sharded components built on the meta device on every rank, the whole pipeline
    read once on the group leader's CPU to fill their shards, the rest placed on this rank's device; `config`:
    the run's parallelize config (`genbatch.parallel.config`)."""
    import os

    from genbatch.parallel.tensor.checkpoint import fill_from_safetensors

    text_encoders = config.text_encoders
    components = sharded(spec, text_encoders)  # reads the encoders' configs: once
    path = spec.path or spec.name
    # the encoders split over the group, read in parts by every rank (the leader's whole copy leaves them out)
    built = _split_encoders(path, ctx, dtype, text_encoders) if spec.name not in PRESETS else {}

    def build(where: str, name: str, load: torch.dtype):
        return built[name] if name in built else _meta_component(where, name, load)

    skeleton = load_skeleton(spec, dtype, meta=components + tuple(built), build=build)
    full = None
    if ctx.group.rank == 0:
        full = finish_placement(load_skeleton(spec, dtype, meta=(), leave_out=tuple(built)), spec, torch.device("cpu"))
    shard_pipeline(skeleton, full, spec, ctx, config)
    del full
    for name, module in built.items():
        fill_from_safetensors(module, os.path.join(path, name), dtype, ctx.device, keep_fp32=keep_in_fp32(module, dtype))
    return finish_placement(skeleton, spec, ctx.device, skip=components + tuple(built))


def _trim_heap() -> None:
    """Give the C heap's freed memory back to the system (glibc's malloc_trim; a no-op where there is none).
    Quantizing layer by layer frees each layer's high-precision weight at once, but glibc raises its mmap
    threshold after the first large frees and then keeps such buffers in its heap: without a trim after each
    layer, a 300M-parameter transformer's int8 load peaked 0.9 GiB higher (bench/quantization.py)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _quantized_encoders(path: str, dtype: torch.dtype, config: ParallelizeConfig, skip) -> dict:
    """The text encoders of a pipeline directory `--quantize-text-encoder` quantizes (but those in `skip`), built
    empty by name, whose safetensors hold each parameter as one stored tensor: they are read layer by layer and
    quantized as they come (the others load whole, then quantize)."""
    import json
    import os

    from genbatch.parallel.apply import TEXT_ENCODERS
    from genbatch.parallel.tensor.checkpoint import whole_load_reason

    if not config.quantization.text_encoders:
        return {}
    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        index = json.load(handle)
    found = {}
    for name in TEXT_ENCODERS:
        if name in skip or not (isinstance(index.get(name), list) and index[name][0] == "transformers"):
            continue
        module = empty_component(path, name, dtype)
        if whole_load_reason(module, os.path.join(path, name)) is None:
            found[name] = module
    return found


def load_tensor_parallel_pipeline(spec: ModelSpec, ctx: ParallelContext, dtype: torch.dtype,
                                  config: ParallelizeConfig = ParallelizeConfig()):
    """`--tp` loading from a pipeline directory (with `--fsdp` too: FSDP then shards the parts read, step 5), and
    quantized loading (`--quantization`): the denoisers (and the text encoders `--text-encoder-parallel` splits,
    or `--quantize-text-encoder` quantizes, when their safetensors hold each parameter as one stored tensor,
    renamed keys included: `_split_encoders`) built with their parameters on the meta device and split by their
    tensor splits, then filled from their safetensors, each rank reading only its own part of every split tensor,
    straight to its device, each Linear quantized as soon as its weight is read (the model never whole at the
    run's dtype); the other components load whole and the other parallel methods (`parallelize_pipeline`) apply as on a whole
    pipeline. `config`: as `load_sharded_pipeline`'s."""
    import os

    from genbatch.parallel.apply import apply_quantization, denoisers, parallelize_pipeline, quantized_components
    from genbatch.parallel.quantize import as_filled
    from genbatch.parallel.tensor.checkpoint import fill_from_safetensors

    path = spec.path or spec.name
    built = _split_encoders(path, ctx, dtype, config.text_encoders)
    built.update(_quantized_encoders(path, dtype, config, skip=built))
    split = denoisers(spec) + tuple(built)
    def build(where: str, name: str, load: torch.dtype):
        return built[name] if name in built else empty_component(where, name, load)

    pipe = load_skeleton(spec, dtype, meta=split, build=build)
    finish_placement(pipe, spec, ctx.device, skip=split)
    parallelize_pipeline(pipe, spec, ctx, config, quantize=False)  # step 2b as the weights are read, below
    quantized = quantized_components(pipe, spec, config)
    for name in split:
        model = getattr(pipe, name, None)
        if model is not None:
            filled = (as_filled(model, config.quantization.kind, ctx.device, after=_trim_heap) if name in quantized
                      else None)
            fill_from_safetensors(model, os.path.join(path, name), dtype, ctx.device,
                                  keep_fp32=keep_in_fp32(model, dtype), filled=filled)
    apply_quantization(pipe, spec, ctx, config)  # the rest (a whole-loaded encoder), and the check of every layer
    if ctx.dims.fsdp and ctx.group.size > 1:  # step 5 on the parts each rank read: no rank held a whole copy
        from genbatch.parallel.apply import shard_loaded

        shard_loaded(pipe, spec, ctx, config)
    return pipe


def _reads_encoder_parts(spec: ModelSpec, ctx: ParallelContext, config: ParallelizeConfig) -> bool:
    """True when some text encoder of `spec`'s directory is split over the job group without `--tp` (and
    without `--fsdp`, whose group leader reads the model), read from its saved config: each rank then reads
    only its part of it."""
    from genbatch.parallel.apply import TEXT_ENCODERS
    from genbatch.parallel.tensor.encoders import config_width, mode_for

    if ctx.group.size == 1 or ctx.dims.fsdp:
        return False
    widths = [config_width(spec.path, name) for name in TEXT_ENCODERS]  # 0: no such encoder (or no config)
    return any(width and mode_for(config.text_encoders, width, fsdp=False) == "tp" for width in widths)


def load_for_group(spec: ModelSpec, ctx: ParallelContext, dtype: torch.dtype, config: ParallelizeConfig):
    """`spec`'s pipeline loaded and parallelised for this rank's job group: a directory's shards read by the
    rank that holds them under tensor parallelism, a directory's quantized components read and quantized layer
    by layer, the leader's weights spread under FSDP, else whole."""
    from genbatch.parallel.apply import parallelize_pipeline

    if spec.name not in PRESETS and (ctx.dims.tp > 1 or config.quantization.enabled
                                     or _reads_encoder_parts(spec, ctx, config)):
        return load_tensor_parallel_pipeline(spec, ctx, dtype, config)
    if ctx.dims.fsdp and ctx.group.size > 1:
        return load_sharded_pipeline(spec, ctx, dtype, config)
    pipe = load_pipeline(spec, ctx.device, dtype)
    parallelize_pipeline(pipe, spec, ctx, config)
    return pipe


def loaded_weights(pipe, spec: ModelSpec) -> dict:
    """Bytes of the weights this rank holds of `pipe`, as loaded and parallelised: `transformer` (every denoiser),
    `text_encoders` (all of them), and each component's own (`components`); quantized weights count their stored
    data and scales (`genbatch.parallel.quantize.weight_bytes`), FSDP and tp parts this rank's part only."""
    from genbatch.parallel.apply import TEXT_ENCODERS, denoisers
    from genbatch.parallel.quantize import weight_bytes

    components = {name: weight_bytes(module) for name, module in pipe.components.items()
                  if isinstance(module, torch.nn.Module)}
    return {"transformer": sum(components.get(name, 0) for name in denoisers(spec)),
            "text_encoders": sum(components.get(name, 0) for name in TEXT_ENCODERS),
            "components": components}


@dataclass(slots=True)
class PipelineCache:
    """Pipelines by model name; `get` loads on first use and applies `prepare` (parallelisation) once."""

    load: Callable[[ModelSpec], Any]
    """Called as load(spec) -> pipeline, parallelised for this rank's group."""
    keep: int = 1
    """Pipelines kept loaded; the least recently used goes when a new model is needed (jobs are ordered by
    model, so a group switches models rarely)."""
    loaded: dict[str, object] = field(default_factory=dict)
    weights: dict[str, dict] = field(default_factory=dict)
    """Model name -> the bytes of its weights on this rank as it was loaded (`loaded_weights`), for every model
    this process loaded (kept after the pipeline itself is let go)."""

    def get(self, spec: ModelSpec):
        if spec.name in self.loaded:
            self.loaded[spec.name] = self.loaded.pop(spec.name)  # most recently used last
        else:
            while len(self.loaded) >= self.keep:
                self.loaded.pop(next(iter(self.loaded)))
            pipe = self.loaded[spec.name] = self.load(spec)
            if hasattr(pipe, "components"):  # a diffusers pipeline (tests may load stand-ins)
                self.weights[spec.name] = loaded_weights(pipe, spec)
        return self.loaded[spec.name]
