"""The transformer and VAE facts the cost model needs, for published models by name or any `ModelSpec`.

Published shapes come from each model's diffusers `transformer/config.json` on the Hub (layers, heads, head
dim, FFN width, patch) and its model card (parameters, defaults); text-encoder and VAE sizes from their
configs. The families genbatch runs list their own (`ModelFamily.published`, in `genbatch.models`); the
models below are planned only. Presets and diffusers directories go through `genbatch.models.resolve_model`
and, for a directory, the safetensors headers (parameter counts, read without loading weights).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import replace

from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.models import families, resolve_model
from genbatch.models.shapes import (
    HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL,
    IMAGE_VAE_GIB_PER_MPX,
    IMAGE_VAE_MFLOP_PER_PIXEL,
    VIDEO_VAE_GIB_PER_MPX,
    WAN_VAE_MFLOP_PER_PIXEL,
    ModelShape,
)

_COGVIDEOX_COMMON = dict(is_video=True, uses_cfg=True, num_layers=42, num_heads=48, head_dim=64, ffn_dim=12288,
                         parameters=5.57e9, text_encoder_parameters=4.76e9, vae_parameters=0.216e9, joint_text=True,
                         text_tokens=226, vae_spatial=8, vae_temporal=4, out_channels=16,
                         vae_mflop_per_pixel=HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL, vae_gib_per_mpx=VIDEO_VAE_GIB_PER_MPX,
                         vae_class="AutoencoderKLCogVideoX", steps=50)

# Models genbatch plans but runs no family of (text encoder: T5-XXL encoder, 4.76B).
_PLANNED_ONLY = (
    ModelShape(name="cogvideox-5b", patch_size=(1, 2, 2), width=720, height=480, frames=49, **_COGVIDEOX_COMMON),
    # CogVideoX 1.5's pipeline pads the latent frames up to a multiple of its temporal patch of 2
    ModelShape(name="cogvideox1.5-5b", patch_size=(2, 2, 2), width=1360, height=768, frames=81,
               pads_frames_to_patch=True, **_COGVIDEOX_COMMON),
)


def _published() -> dict[str, ModelShape]:
    """Every published shape by name: the families' own, then the planned-only ones (a family's wins)."""
    shapes = {shape.name: shape for family in families().values() for shape in family.published}
    for shape in _PLANNED_ONLY:
        shapes.setdefault(shape.name, shape)
    return shapes


PUBLISHED: dict[str, ModelShape] = _published()


def _safetensors_parameters(directory: str) -> float | None:
    """Parameters stored in a directory's safetensors files, from their headers alone; None when there are none."""
    if not os.path.isdir(directory):
        return None
    total, found = 0, False
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        found = True
        with open(os.path.join(directory, name), "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                total += math.prod(entry["shape"])
    return float(total) if found else None


def _vae_costs(vae_class: str, is_video: bool) -> tuple[float, float]:
    """(MFLOP per output pixel, GiB per million pixels) of a VAE's decode, from the published model that uses
    this VAE class (the family's own record); by kind (video or image) for a class none publishes."""
    for shape in PUBLISHED.values():
        if shape.vae_class == vae_class and shape.is_video == is_video:
            return shape.vae_mflop_per_pixel, shape.vae_gib_per_mpx
    if is_video:
        return WAN_VAE_MFLOP_PER_PIXEL, VIDEO_VAE_GIB_PER_MPX
    return IMAGE_VAE_MFLOP_PER_PIXEL, IMAGE_VAE_GIB_PER_MPX


def _vae_class(spec: ModelSpec, root: str | None) -> str:
    """The VAE's diffusers class: from the pipeline directory's vae/config.json, else the family's published
    models' (a preset builds its family's VAE)."""
    if root:
        try:
            with open(os.path.join(root, "vae", "config.json")) as handle:
                return str(json.load(handle).get("_class_name", ""))
        except (OSError, ValueError):
            pass
    published = families()[spec.family].published if spec.family in families() else ()
    return published[0].vae_class if published else ""


def shape_from_spec(spec: ModelSpec) -> ModelShape:
    """The shape of a preset or a diffusers directory: its spec (TP all-reduces included), its VAE's class and
    that class's decode costs, and its safetensors headers for sizes."""
    root = spec.path if spec.path and os.path.isdir(spec.path) else None  # a preset has no directory
    d = spec.hidden_size
    # Without weights on disk: attention (and cross-attention) projections plus the MLP.
    estimate = spec.num_layers * (4 * d * d * (1 if spec.joint_text else 2) + 2 * d * spec.ffn_dim)
    parameters = spec.parameters or (root and _safetensors_parameters(os.path.join(root, "transformer"))) or estimate
    text = sum(_safetensors_parameters(os.path.join(root, sub)) or 0.0
               for sub in ("text_encoder", "text_encoder_2", "text_encoder_3")) if root else 0.0
    vae = (_safetensors_parameters(os.path.join(root, "vae")) or 0.0) if root else 0.0
    defaults = spec.defaults
    vae_class = _vae_class(spec, root)
    vae_mflop, vae_gib = _vae_costs(vae_class, spec.is_video)
    plans = list(families()[spec.family].transformers.values()) if spec.family in families() else []
    sequence = all(plan.sequence is not None for plan in plans)
    return ModelShape(
        name=spec.name,
        is_video=spec.is_video,
        uses_cfg=spec.uses_cfg,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        head_dim=spec.head_dim,
        ffn_dim=spec.ffn_dim,
        parameters=float(parameters),
        text_encoder_parameters=float(text),
        vae_parameters=float(vae),
        joint_text=spec.joint_text,
        text_tokens=spec.text_tokens,
        patch_size=tuple(spec.patch_size),
        vae_spatial=spec.vae_spatial,
        vae_temporal=spec.frame_multiple if spec.is_video else 1,
        out_channels=spec.out_channels,
        vae_mflop_per_pixel=vae_mflop,
        vae_gib_per_mpx=vae_gib,
        vae_class=vae_class,
        tp_all_reduces=spec.tp_all_reduces,
        joins_image_tokens=spec.joins_image_tokens,
        sequence_parallel=sequence,
        pipeline_stages=sequence and all(plan.carried for plan in plans),
        width=int(defaults.get("width") or 1024),
        height=int(defaults.get("height") or 1024),
        frames=int(defaults["num_frames"]) if spec.is_video and defaults.get("num_frames") else None,
        steps=int(defaults.get("num_inference_steps") or 28),
    )


def resolve_shape(model: str | ModelSpec | ModelShape) -> ModelShape:
    """A published model by name, a preset or pipeline directory (via `resolve_model`), or a spec or shape."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, ModelSpec):
        return shape_from_spec(model)
    published = PUBLISHED.get(model.lower())
    if published is not None:
        return replace(published, name=model)
    try:
        return shape_from_spec(resolve_model(model))
    except UnknownModelError as error:
        raise UnknownModelError(f"{error}; or name a published model: {', '.join(PUBLISHED)}") from error


__all__ = ["PUBLISHED", "ModelShape", "resolve_shape", "shape_from_spec"]
