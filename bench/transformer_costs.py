"""The planner's transformer costs against counted ones: FLOPs of one forward and weight bytes, for every
published model.

    python bench/transformer_costs.py                      # every published model (about a minute on one core)
    python bench/transformer_costs.py --models flux.2-dev,ltx-2

Each published model's transformer is built from its published config (`ModelFamily.published`) on the meta
device, in bf16 as the runner loads it (diffusers' `_keep_in_fp32_modules` in fp32), and runs one forward at the
planner's default workload (`make_workload` of its `PUBLISHED` shape: the size, frames and text tokens the planner
prices; an edit or reference-image model with its input image's tokens at the output's size, as the planner
counts them) under torch's `FlopCounterMode`. Nothing is computed: meta tensors carry shapes only, and the FLOP
counter prices each matmul, convolution and attention call from them (elementwise work, norms and softmax are not
counted, and the planner's formula leaves them out too). Beside each count the script prints the
planner's: FLOPs of one forward (`genbatch.planner.cost.forward_flops`) and weight bytes (`ModelShape.parameters`
at `BYTES_PER_VALUE`), with their ratio planner / counted. A transformer that keeps its prefix's keys and values
from the first step (Qwen-Image 2.1) is counted as the runner steps it: the first step's forward over the whole
sequence filling the cache, the later steps' over the output's tokens against it, averaged over the default steps;
the cache's bytes are printed beside the planner's (`memory.kept_prefix_bytes`). It exits with status 1 when any
ratio is outside [0.75, 1.25].

Some forwards read the values of small index tensors (a text mask's valid tokens, a block-causal layout's image
positions), which meta tensors do not have. `ShadowValues` keeps a CPU copy beside every small meta tensor made
from known values (the inputs built here, factory calls, and what is computed from those alone) and answers
those reads from it; the large tensors, and everything computed from a weight, stay shapes only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WITHIN = 0.25
"""The agreement the planner's model is held to."""
DTYPE = torch.bfloat16
"""The dtype the runner loads a transformer in."""
SHADOW_LIMIT = 1 << 22
"""Meta tensors of at most this many elements made from known values keep a CPU copy (`ShadowValues`)."""


class ShadowValues(TorchDispatchMode):
    """Meta tensors that carry their values: a small tensor made from known values (a factory call on the meta
    device, `shadowed`, or an operator whose meta inputs all carry values) keeps a CPU copy as `tensor._shadow`,
    computed beside the meta operator. The reads meta tensors cannot answer use that copy: `.item()`, `.tolist()`,
    `nonzero`, and indexing by a boolean mask (the mask becomes the positions of its True values). The copies are
    computed with every mode off, so a `FlopCounterMode` around counts the meta operators alone."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEXING:  # boolean masks that carry values -> the positions of their True values
            args = (args[0], [place for index in args[1] for place in _positions(index)], *args[2:])
        flat = [value for value in tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)]
        metas = [value for value in flat if value.device.type == "meta"]
        if metas and all(hasattr(value, "_shadow") for value in metas):
            out = None
            if func not in _READS:
                try:
                    out = func(*args, **kwargs)
                except (NotImplementedError, RuntimeError):  # another operator whose shape depends on values
                    pass
                if out is not None and not _small(out):  # (an attention mask of N x N): its shape is enough
                    return out
            with _disable_current_modes():
                copies = func(*tree_map(_shadow_of, args), **tree_map(_shadow_of, kwargs))
            if out is None:
                return copies if func is torch.ops.aten._local_scalar_dense.default else tree_map(_meta_or, copies)
            _attach(out, copies)
            return out
        out = func(*args, **kwargs)
        if func._schema.is_mutable and args and hasattr(args[0], "_shadow"):
            del args[0]._shadow  # written from values it does not know: its copy no longer holds
        if not metas and isinstance(out, torch.Tensor) and out.device.type == "meta" and out.numel() <= SHADOW_LIMIT:
            # a factory call or a copy to the meta device: the same call on the CPU gives its values
            with _disable_current_modes():
                out._shadow = func(*args, **{**kwargs, "device": torch.device("cpu")})
        return out

    def __enter__(self):
        # `tolist` reads data, and `torch.tensor(..., device="meta")` builds a tensor from Python values, both
        # without an operator a mode sees: patched for the mode's extent
        torch.Tensor.tolist, torch.tensor = _tolist, _tensor
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist, torch.tensor = _TOLIST, _TENSOR
        return super().__exit__(*exc)


_TOLIST = torch.Tensor.tolist
_TENSOR = torch.tensor
_READS = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
          torch.ops.aten._local_scalar_dense.default}
"""Operators whose output shape depends on their input's values."""
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
             torch.ops.aten._index_put_impl_.default}


def _tolist(tensor: torch.Tensor):
    """`Tensor.tolist` under `ShadowValues`: a meta tensor's copy's values."""
    if tensor.device.type == "meta" and hasattr(tensor, "_shadow"):
        tensor = tensor._shadow
    return _TOLIST(tensor)


def _tensor(data, *args, device=None, **kwargs):
    """`torch.tensor` under `ShadowValues`: on the meta device, a tensor that carries the values it was made of."""
    if device is not None and torch.device(device).type == "meta":
        return shadowed(_TENSOR(data, *args, **kwargs))
    return _TENSOR(data, *args, device=device, **kwargs)


def _shadow_of(value):
    return value._shadow if isinstance(value, torch.Tensor) and value.device.type == "meta" else value


def _meta_of(copy: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(copy, device="meta")
    out._shadow = copy
    return out


def _small(out) -> bool:
    """True when every tensor of an operator's output is small enough to keep a copy of."""
    return all(tensor.numel() <= SHADOW_LIMIT for tensor in tree_leaves(out) if isinstance(tensor, torch.Tensor))


def _meta_or(copy):
    return _meta_of(copy) if isinstance(copy, torch.Tensor) else copy


def _attach(out, copies) -> None:
    if isinstance(out, torch.Tensor) and isinstance(copies, torch.Tensor):
        if out.numel() <= SHADOW_LIMIT:
            out._shadow = copies
    elif isinstance(out, (tuple, list)) and isinstance(copies, (tuple, list)):
        for one, copy in zip(out, copies, strict=False):
            _attach(one, copy)


def _positions(index) -> list:
    """An index of `aten.index`: a boolean mask that carries its values -> the positions of its True values, one
    tensor for each of its dimensions (meta, carrying them too); any other index as it is."""
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool and hasattr(index, "_shadow"):
        return [_meta_of(place) for place in index._shadow.nonzero(as_tuple=True)]
    return [index]


def shadowed(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (on the CPU) as a meta tensor that carries its values."""
    out = torch.empty_like(tensor, device="meta")
    out._shadow = tensor
    return out


def _values(size: tuple[int, ...], dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """A large input: shape only."""
    return torch.empty(size, dtype=dtype, device="meta")


def _known(values) -> torch.Tensor:
    """A small input whose values the forward may read: a meta tensor that carries them (floats in bf16, as the
    pipelines pass timesteps)."""
    tensor = torch.as_tensor(values)
    return shadowed(tensor.to(DTYPE) if tensor.is_floating_point() else tensor)


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """The planner's default workload of one model, in the sizes its transformer's inputs take."""

    latent: tuple[int, ...]
    """The latent's (frames, height, width) for video, (height, width) for an image (`ModelSpec.latent_shape`)."""
    image_tokens: int
    """Tokens of the output's latent after patching."""
    text_tokens: int
    """Text tokens the planner counts."""
    images: int
    """Latent grids in the image stream: 2 where an input image's tokens join the output's, else 1."""
    frames: int | None
    """Output frames (video)."""
    steps: int
    """Denoising steps of the job."""


def _flux(config: Mapping[str, Any], grid: Grid) -> dict:
    # FLUX.1: 2 x 2 latent pixels packed to a token (64 channels), ids (n, 3); Kontext's input image's tokens follow
    tokens = grid.image_tokens * grid.images
    inputs = dict(hidden_states=_values((1, tokens, config["in_channels"])),
                  encoder_hidden_states=_values((1, grid.text_tokens, config["joint_attention_dim"])),
                  pooled_projections=_values((1, config["pooled_projection_dim"])), timestep=_known([0.5]),
                  img_ids=_known(torch.zeros(tokens, 3)), txt_ids=_known(torch.zeros(grid.text_tokens, 3)))
    if config.get("guidance_embeds"):
        inputs["guidance"] = _known([3.5])
    return inputs


def _flux2(config: Mapping[str, Any], grid: Grid) -> dict:
    # FLUX.2: tokens of 128 channels with ids (1, n, 4); the reference image's tokens after the noise's
    tokens = grid.image_tokens * grid.images
    inputs = dict(hidden_states=_values((1, tokens, config["in_channels"])),
                  encoder_hidden_states=_values((1, grid.text_tokens, config["joint_attention_dim"])),
                  timestep=_known([0.5]), img_ids=_known(torch.zeros(1, tokens, 4)),
                  txt_ids=_known(torch.zeros(1, grid.text_tokens, 4)))
    if config.get("guidance_embeds"):
        inputs["guidance"] = _known([4.0])
    return inputs


def _sd3(config: Mapping[str, Any], grid: Grid) -> dict:
    height, width = grid.latent
    return dict(hidden_states=_values((1, config["in_channels"], height, width)),
                encoder_hidden_states=_values((1, grid.text_tokens, config["joint_attention_dim"])),
                pooled_projections=_values((1, config["pooled_projection_dim"])), timestep=_known([500.0]))


def _qwen_image(config: Mapping[str, Any], grid: Grid) -> dict:
    # 2 x 2 latent pixels a token; Qwen-Image-Edit's input image is a second grid of the image stream
    height, width = (side // config["patch_size"] for side in grid.latent)
    return dict(hidden_states=_values((1, grid.image_tokens * grid.images, config["in_channels"])),
                encoder_hidden_states=_values((1, grid.text_tokens, config["joint_attention_dim"])),
                encoder_hidden_states_mask=_known(torch.ones(1, grid.text_tokens, dtype=torch.long)),
                timestep=_known([0.5]), img_shapes=[[(1, height, width)] * grid.images])


def _qwen_image_21(config: Mapping[str, Any], grid: Grid) -> list[tuple[float, dict]]:
    # one sequence: the prompt's tokens, the condition image's vision slots (each 2 x 2 latent tokens), then the
    # output's slots; the condition image's latent tokens first in the image stream, the output's last. With
    # `causal_condition` the runner (as the pipeline) keeps the prefix's keys and values: the first step fills the
    # cache over the whole sequence, every later step runs the output's tokens alone against it
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    height, width = grid.latent
    slots = grid.image_tokens // 4
    condition = grid.images - 1
    mask = torch.cat([torch.zeros(grid.text_tokens, dtype=torch.bool), torch.ones(slots * condition, dtype=torch.bool),
                      torch.ones(slots, dtype=torch.bool)])[None]
    call = dict(hidden_states=_values((1, grid.image_tokens * grid.images, config["in_channels"])),
                encoder_hidden_states=_values((1, grid.text_tokens + slots * condition, config["context_in_dim"])),
                timestep=_known([0.5]), img_shapes=[[(1, height, width)] * grid.images], img_mask=_known(mask))
    if not config.get("causal_condition", True):
        return [(1.0, call)]
    cache = QwenImage21KVCache(config["num_layers"])
    return [(1 / grid.steps, {**call, "kv_cache": cache, "kv_cache_mode": "extract"}),
            (1 - 1 / grid.steps, {**call, "kv_cache": cache, "kv_cache_mode": "cached"})]


def _wan(config: Mapping[str, Any], grid: Grid) -> dict:
    inputs = dict(hidden_states=_values((1, config["in_channels"], *grid.latent)), timestep=_known([500.0]),
                  encoder_hidden_states=_values((1, 512, config["text_dim"])))
    if config.get("image_dim"):  # Wan I2V: CLIP's image tokens beside the prompt's 512
        inputs["encoder_hidden_states_image"] = _values((1, grid.text_tokens - 512, config["image_dim"]))
    return inputs


def _hunyuan_video(config: Mapping[str, Any], grid: Grid) -> dict:
    return dict(hidden_states=_values((1, config["in_channels"], *grid.latent)), timestep=_known([500.0]),
                encoder_hidden_states=_values((1, grid.text_tokens, config["text_embed_dim"])),
                encoder_attention_mask=_known(torch.ones(1, grid.text_tokens, dtype=torch.long)),
                pooled_projections=_values((1, config["pooled_projection_dim"])), guidance=_known([6000.0]))


def _hunyuan_video15(config: Mapping[str, Any], grid: Grid) -> dict:
    # the prompt's 1000 tokens, ByT5's 256, the 729 image tokens (zeros for text-to-video), all valid but the image's
    from genbatch.models.hunyuan_video15 import GLYPH_TOKENS, IMAGE_TOKENS, QWEN_TOKENS

    return dict(hidden_states=_values((1, config["in_channels"], *grid.latent)), timestep=_known([500.0]),
                encoder_hidden_states=_values((1, QWEN_TOKENS, config["text_embed_dim"])),
                encoder_attention_mask=_known(torch.ones(1, QWEN_TOKENS, dtype=torch.long)),
                encoder_hidden_states_2=_values((1, GLYPH_TOKENS, config["text_embed_2_dim"])),
                encoder_attention_mask_2=_known(torch.ones(1, GLYPH_TOKENS, dtype=torch.long)),
                image_embeds=_known(torch.zeros(1, IMAGE_TOKENS, config["image_embed_dim"], dtype=DTYPE)))


def _z_image(config: Mapping[str, Any], grid: Grid) -> dict:
    # one image (c, 1, h, w) and its caption's (n, d), as lists
    return dict(x=[_values((config["in_channels"], 1, *grid.latent))], t=_known([0.5]),
                cap_feats=[_values((grid.text_tokens, config["cap_feat_dim"]))])


def _ltx2(config: Mapping[str, Any], grid: Grid) -> dict:
    # packed video tokens (1, f h w, 128) and audio latent frames (1, a, 8 channels x 16 mel bins); the prompt's
    # 1024 tokens for each stream
    from genbatch.models.ltx2 import AUDIO_LATENTS_PER_SECOND, CALL_DEFAULTS

    frames, height, width = grid.latent
    audio = round(grid.frames / CALL_DEFAULTS["fps"] * AUDIO_LATENTS_PER_SECOND)
    return dict(hidden_states=_values((1, frames * height * width, config["in_channels"])),
                audio_hidden_states=_values((1, audio, config["audio_in_channels"])),
                encoder_hidden_states=_values((1, grid.text_tokens, config["caption_channels"])),
                audio_encoder_hidden_states=_values((1, grid.text_tokens, config["caption_channels"])),
                encoder_attention_mask=_known(torch.ones(1, grid.text_tokens, dtype=torch.long)),
                audio_encoder_attention_mask=_known(torch.ones(1, grid.text_tokens, dtype=torch.long)),
                timestep=_known([0.5]), sigma=_known([0.5]), num_frames=frames, height=height, width=width,
                fps=float(CALL_DEFAULTS["fps"]), audio_num_frames=audio)


INPUTS: dict[str, Callable[[Mapping[str, Any], Grid], dict | list[tuple[float, dict]]]] = {
    "FluxTransformer2DModel": _flux,
    "Flux2Transformer2DModel": _flux2,
    "SD3Transformer2DModel": _sd3,
    "QwenImageTransformer2DModel": _qwen_image,
    "QwenImage21Transformer2DModel": _qwen_image_21,
    "WanTransformer3DModel": _wan,
    "HunyuanVideoTransformer3DModel": _hunyuan_video,
    "HunyuanVideo15Transformer3DModel": _hunyuan_video15,
    "ZImageTransformer2DModel": _z_image,
    "LTX2VideoTransformer3DModel": _ltx2,
}
"""One forward's inputs by transformer class, from its published config and the workload's sizes; or a step's
forwards in the order they run, each with its share of the job's steps."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Count:
    """One published model's transformer, counted and as the planner prices it."""

    name: str
    transformer: str
    counted_flops: float
    planner_flops: float
    counted_bytes: float
    planner_bytes: float
    seconds: float
    counted_kept: float = 0.0
    """Bytes of the keys and values the transformer keeps from its first step (its cache once filled); 0: none."""
    planner_kept: float = 0.0
    """The planner's (`memory.kept_prefix_bytes`, one rank, the branch counted)."""

    @property
    def flops_ratio(self) -> float:
        return self.planner_flops / self.counted_flops

    @property
    def bytes_ratio(self) -> float:
        return self.planner_bytes / self.counted_bytes

    @property
    def kept_ratio(self) -> float | None:
        return self.planner_kept / self.counted_kept if self.counted_kept else None

    @property
    def within(self) -> bool:
        ratios = (self.flops_ratio, self.bytes_ratio, self.kept_ratio if self.counted_kept else 1.0)
        return all(abs(ratio - 1) <= WITHIN for ratio in ratios) and bool(self.counted_kept) == bool(self.planner_kept)


def published_models() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Every published model's (transformer class, published transformer config), by name."""
    from genbatch.models import families

    return {model.name: (next(iter(family.transformers)), model.transformer) for family in families().values()
            for model in family.published}


def build(transformer: str, config: Mapping[str, Any]) -> torch.nn.Module:
    """The transformer from its published config on the meta device, in bf16 but for its fp32 modules."""
    import diffusers

    with torch.device("meta"):
        model = getattr(diffusers, transformer).from_config(dict(config)).eval().to(DTYPE)
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, module in model.named_modules():
        if any(part in name.split(".") for part in keep):
            module.to(torch.float32)
    return model


def workload_grid(name: str):
    """The planner's default workload of the published model `name`, and its grid."""
    from genbatch.planner.shapes import PUBLISHED
    from genbatch.planner.workload import make_workload

    shape = PUBLISHED[name]
    work = make_workload(shape)
    grid = Grid(latent=shape.latent_shape(work.width, work.height, work.frames), image_tokens=work.image_tokens,
                text_tokens=shape.text_tokens, images=2 if shape.joins_image_tokens else 1, frames=work.frames,
                steps=work.steps)
    return work, grid


def count_forward(model: torch.nn.Module, forwards: dict | list[tuple[float, dict]]) -> float:
    """FLOPs of one forward of `model` (a step's average over `forwards`, each with its share of the steps),
    counted on meta tensors."""
    from torch.utils.flop_counter import FlopCounterMode

    total = 0.0
    for share, inputs in forwards if isinstance(forwards, list) else [(1.0, forwards)]:
        with torch.no_grad(), FlopCounterMode(display=False) as counter, ShadowValues():
            model(**inputs, return_dict=False)
        total += share * counter.get_total_flops()
    return total


def count(name: str) -> Count:
    """Count the published model `name`'s transformer beside the planner's prices."""
    from genbatch.parallel.dims import ParallelDims
    from genbatch.planner.cost import forward_flops
    from genbatch.planner.memory import kept_prefix_bytes
    from genbatch.planner.workload import BYTES_PER_VALUE

    start = time.perf_counter()
    transformer, config = published_models()[name]
    work, grid = workload_grid(name)
    model = build(transformer, config)
    forwards = INPUTS[transformer](config, grid)
    flops = count_forward(model, forwards)
    weights = sum(tensor.numel() * tensor.element_size() for tensor in (*model.parameters(), *model.buffers()))
    one_branch = ParallelDims(cfg=2) if work.shape.uses_cfg else ParallelDims()  # the planner's, for one branch
    return Count(name=name, transformer=transformer, counted_flops=flops, planner_flops=forward_flops(work),
                 counted_bytes=float(weights), planner_bytes=work.shape.parameters * BYTES_PER_VALUE,
                 seconds=time.perf_counter() - start, counted_kept=kept_bytes(forwards),
                 planner_kept=kept_prefix_bytes(one_branch, work))


def kept_bytes(forwards: dict | list[tuple[float, dict]]) -> float:
    """Bytes of the keys and values held in the forwards' caches (`kv_cache`, filled by the first): 0 without."""
    caches = {id(inputs["kv_cache"]): inputs["kv_cache"] for _, inputs in
              (forwards if isinstance(forwards, list) else [(1.0, forwards)]) if inputs.get("kv_cache") is not None}
    return float(sum(tensor.numel() * tensor.element_size() for cache in caches.values()
                     for layer in cache.layer_caches for tensor in (layer.k, layer.v) if tensor is not None))


HEADER = (f"{'model':28s} {'transformer':34s} {'TFLOP counted':>13s} {'planner':>9s} {'ratio':>6s}   "
          f"{'GB counted':>10s} {'planner':>8s} {'ratio':>6s}")


def line(result: Count) -> str:
    verdict = "" if result.within else f"  OUTSIDE {WITHIN:.0%}"
    return (f"{result.name:28s} {result.transformer:34s} {result.counted_flops / 1e12:13.2f} "
            f"{result.planner_flops / 1e12:9.2f} {result.flops_ratio:6.3f}   {result.counted_bytes / 1e9:10.2f} "
            f"{result.planner_bytes / 1e9:8.2f} {result.bytes_ratio:6.3f}{verdict}  ({result.seconds:.1f} s)"
            + (f"\n{'':28s} {'  kept keys and values (one branch)':34s} {'':13s} {'':9s} {'':6s}   "
               f"{result.counted_kept / 1e9:10.2f} {result.planner_kept / 1e9:8.2f} {result.kept_ratio:6.3f}"
               if result.counted_kept else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated published model names (default: all)")
    opts = parser.parse_args(argv)
    import warnings

    from diffusers.utils import logging as diffusers_logging

    warnings.filterwarnings("ignore")
    diffusers_logging.set_verbosity_error()
    names = list(published_models())
    if opts.models:
        unknown = sorted(set(opts.models.split(",")) - set(names))
        if unknown:
            parser.error(f"--models {','.join(unknown)}: not published models; choose from {', '.join(names)}")
        names = opts.models.split(",")
    print("one transformer forward at the planner's default workload (FLOPs: planner / counted) and its weights "
          f"(bf16 bytes); within {WITHIN:.0%} is the target")
    print(HEADER)
    results = []
    for name in names:
        result = count(name)
        print(line(result), flush=True)
        results.append(result)
    inside = sum(result.within for result in results)
    print(f"{inside} of {len(results)} within {WITHIN:.0%}")
    return 0 if inside == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
