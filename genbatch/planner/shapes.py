"""The models the cost model prices: published ones by name or hub id, and any `ModelSpec` (a preset, a directory).

A family names its published models (`ModelFamily.published`: each one's configs, hub id and sizes); their shapes are
built here the way a pipeline directory's is, by the family's own `read_spec` of those configs (`published_shape`),
and carry the family's VAE costs (`ModelFamily.vae_costs`). A preset's or directory's spec becomes a shape with its
sizes from the safetensors headers (read without loading weights). The CogVideoX models below are planned only: no
family runs them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import replace

from genbatch.models import families, published_spec, resolve_model
from genbatch.models.base import ModelFamily
from genbatch.models.shapes import ModelShape, Published
from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.models.vae_costs import COGVIDEOX_VAE, IMAGE_DEFAULT, VIDEO_DEFAULT, VaeCosts

_COGVIDEOX_COMMON = dict(family="cogvideox", is_video=True, uses_cfg=True, size_multiple=16, frame_multiple=4,
                         num_layers=42, num_heads=48, head_dim=64, ffn_dim=12288, parameters=5.57e9,
                         text_encoder_parameters=4.76e9, vae_parameters=0.216e9, joint_text=True, text_tokens=226,
                         vae_spatial=8, out_channels=16, vae_costs=COGVIDEOX_VAE)

# Models genbatch plans but runs no family of (text encoder: T5-XXL encoder, 4.76B).
_PLANNED_ONLY = (
    ModelShape(name="cogvideox-5b", hub_id="THUDM/CogVideoX-5b", patch_size=(1, 2, 2),
               defaults={"width": 720, "height": 480, "num_frames": 49, "num_inference_steps": 50},
               **_COGVIDEOX_COMMON),
    # CogVideoX 1.5's pipeline pads the latent frames up to a multiple of its temporal patch of 2
    ModelShape(name="cogvideox1.5-5b", hub_id="THUDM/CogVideoX1.5-5B", patch_size=(2, 2, 2),
               defaults={"width": 1360, "height": 768, "num_frames": 81, "num_inference_steps": 50},
               pads_frames_to_patch=True, **_COGVIDEOX_COMMON),
)


def _parallel_support(spec: ModelSpec) -> dict[str, bool]:
    """Whether the family's transformers have sequence-parallel split points, patches DistriFusion can make stale,
    and PipeFusion stages."""
    plans = list(families()[spec.family].transformers.values()) if spec.family in families() else []
    sequence = all(plan.sequence is not None for plan in plans)
    patches = sequence and not any(plan.sequence.kept_prefix for plan in plans)
    return {"sequence_parallel": sequence, "patch_parallel": patches,
            "pipeline_stages": patches and all(plan.carried for plan in plans)}


def vae_costs_of(spec: ModelSpec) -> VaeCosts:
    """The VAE costs of `spec`'s family (`ModelFamily.vae_costs`); a family that names none is priced as Wan's VAE
    (video) or the image VAE."""
    family = families().get(spec.family)
    if family is not None and family.vae_costs is not None:
        return family.vae_costs
    return VIDEO_DEFAULT if spec.is_video else IMAGE_DEFAULT


def published_shape(family: ModelFamily, model: Published) -> ModelShape:
    """A published model's shape: the family's `read_spec` of its configs (as a pipeline directory's), with its
    sizes and the family's VAE costs."""
    spec = published_spec(family, model)
    return ModelShape.of(spec, parameters=model.parameters, text_encoder_parameters=model.text_encoder_parameters,
                         text_encoder_split_parameters=model.text_encoder_split_parameters,
                         vae_parameters=model.vae_parameters, vae_costs=vae_costs_of(spec), hub_id=model.hub_id,
                         **_parallel_support(spec))


def _published() -> dict[str, ModelShape]:
    """Every published shape by name: the families' own, then the planned-only ones (a family's wins)."""
    shapes = {model.name: published_shape(family, model) for family in families().values()
              for model in family.published}
    for shape in _PLANNED_ONLY:
        shapes.setdefault(shape.name, shape)
    return shapes


PUBLISHED: dict[str, ModelShape] = _published()
BY_HUB_ID: dict[str, ModelShape] = {shape.hub_id.lower(): shape for shape in PUBLISHED.values() if shape.hub_id}
"""The published shapes by hub id (lower case)."""


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


def shape_from_spec(spec: ModelSpec) -> ModelShape:
    """The shape of a preset or a diffusers directory: its spec (TP all-reduces included), its family's VAE costs,
    and its safetensors headers for sizes."""
    root = spec.path if spec.path and os.path.isdir(spec.path) else None  # a preset has no directory
    d = spec.hidden_size
    # Without weights on disk: attention (and cross-attention) projections plus the MLP.
    estimate = spec.num_layers * (4 * d * d * (1 if spec.joint_text else 2) + spec.mlp_matrices * d * spec.ffn_dim)
    parameters = spec.parameters or (root and _safetensors_parameters(os.path.join(root, "transformer"))) or estimate
    text = sum(_safetensors_parameters(os.path.join(root, sub)) or 0.0
               for sub in ("text_encoder", "text_encoder_2", "text_encoder_3")) if root else 0.0
    vae = (_safetensors_parameters(os.path.join(root, "vae")) or 0.0) if root else 0.0
    return ModelShape.of(spec, parameters=float(parameters), text_encoder_parameters=float(text),
                         vae_parameters=float(vae), vae_costs=vae_costs_of(spec), **_parallel_support(spec))


def resolve_shape(model: str | ModelSpec | ModelShape) -> ModelShape:
    """A published model by name or hub id, a preset or pipeline directory (via `resolve_model`), or a spec or
    shape."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, ModelSpec):
        return shape_from_spec(model)
    published = PUBLISHED.get(model.lower()) or BY_HUB_ID.get(model.split("@", 1)[0].lower())
    if published is not None:
        return replace(published, name=model)
    try:
        return shape_from_spec(resolve_model(model))
    except UnknownModelError as error:
        raise UnknownModelError(f"{error}; or name a published model: {', '.join(PUBLISHED)}") from error


__all__ = ["BY_HUB_ID", "PUBLISHED", "ModelShape", "published_shape", "resolve_shape", "shape_from_spec",
           "vae_costs_of"]
