"""What a model is, read cheaply: its family, the sizes it accepts, its defaults and its transformer's shape.

A `ModelSpec` is resolved from a preset name, a diffusers pipeline directory, or a Hugging Face hub id
(`org/name[@revision]`, found in the local hub cache: `genbatch.jobs.hub`) by reading small JSON configs
only (never weights), so manifest validation, planning and scheduling can ask about a model
without loading it. Loading the weights is the runner's job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache

from genbatch.jobs.hub import HubModelMissing, cached_snapshot, parse_hub_id

# The diffusers pipeline class named in model_index.json -> the family genbatch runs it as.
PIPELINE_FAMILIES = {
    "WanPipeline": "wan",
    "FluxPipeline": "flux",
    "StableDiffusion3Pipeline": "sd3",
}

# The defaults of each family's diffusers pipeline `__call__` (None: derived from the model's config).
FAMILY_DEFAULTS: dict[str, dict[str, float | int | None]] = {
    "wan": {"width": 832, "height": 480, "num_frames": 81, "num_inference_steps": 50, "guidance_scale": 5.0, "fps": 16},
    "flux": {"width": None, "height": None, "num_inference_steps": 28, "guidance_scale": 3.5},
    "sd3": {"width": None, "height": None, "num_inference_steps": 28, "guidance_scale": 7.0},
}


class UnknownModelError(ValueError):
    """The model name is neither a preset nor a readable diffusers pipeline directory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The facts about one model that planning, validation and scheduling need, without its weights."""

    name: str
    """The name as the user gave it: a preset name, a pipeline directory or a hub id (`org/name[@rev]`)."""
    family: str
    """`wan`, `flux` or `sd3`: which denoise loop and parallel plan apply."""
    is_video: bool
    """True for text-to-video models (the output is an MP4, `num_frames` applies)."""
    uses_cfg: bool
    """True when the model runs a conditional and an unconditional branch per step (CFG parallel applies)."""
    size_multiple: int
    """Width and height must be multiples of this (VAE downsampling times the patch size)."""
    frame_multiple: int
    """Video only: `num_frames - 1` must be a multiple of this (the VAE's temporal compression)."""
    vae_spatial: int
    """Pixels per latent pixel along height and width."""
    patch_size: tuple[int, ...]
    """The transformer's patch size: (t, h, w) for video, (h, w) for images."""
    num_layers: int
    """Transformer blocks (all kinds together)."""
    num_heads: int
    """Attention heads; the Ulysses degree must divide it."""
    head_dim: int
    """Channels per head."""
    text_tokens: int
    """Text tokens the transformer attends to (jointly for MMDiT models, by cross-attention for Wan)."""
    parameters: int | None = None
    """Transformer parameter count when known (from the safetensors index or the preset)."""
    defaults: dict[str, float | int] = field(default_factory=dict)
    """Per-job defaults: width, height, num_frames, num_inference_steps, guidance_scale, fps."""
    path: str | None = None
    """The pipeline directory the weights load from (a hub id's cached snapshot); None for a preset."""

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    def latent_shape(self, width: int, height: int, num_frames: int | None) -> tuple[int, ...]:
        """(frames, height, width) of the latent for video, (height, width) for images."""
        h, w = height // self.vae_spatial, width // self.vae_spatial
        if self.is_video:
            return ((num_frames - 1) // self.frame_multiple + 1, h, w)
        return (h, w)

    def tokens(self, width: int, height: int, num_frames: int | None) -> int:
        """Image tokens the transformer sees for one sample (latent size over the patch size)."""
        shape = self.latent_shape(width, height, num_frames)
        count = 1
        for extent, patch in zip(shape, self.patch_size[-len(shape) :]):
            count *= max(extent // patch, 1)
        return count

    def geometry_problems(self, width: int, height: int, num_frames: int | None) -> list[tuple[str, str]]:
        """The (column, reason) pairs for sizes this model cannot take; empty when they are fine."""
        problems = []
        for column, value in (("width", width), ("height", height)):
            if value % self.size_multiple:
                fixed = max(self.size_multiple, round(value / self.size_multiple) * self.size_multiple)
                problems.append((column, f"{value} is not a multiple of {self.size_multiple} (use {fixed})"))
        if self.is_video and num_frames is not None and (num_frames - 1) % self.frame_multiple:
            fixed = (num_frames - 1) // self.frame_multiple * self.frame_multiple + 1
            problems.append(
                ("num_frames", f"{num_frames} is not of the form {self.frame_multiple}k+1 (use {fixed})")
            )
        return problems


def _spec_from_configs(
    name: str, family: str, transformer: dict, vae: dict, defaults: dict | None, path: str | None = None
) -> ModelSpec:
    """A spec from the transformer's and VAE's configs (`defaults`: None for the family's pipeline's own)."""
    if family == "wan":
        spatial = vae.get("scale_factor_spatial", 8)
        patch = tuple(transformer["patch_size"])
        return ModelSpec(
            name=name,
            family=family,
            is_video=True,
            uses_cfg=True,
            size_multiple=spatial * patch[1],
            frame_multiple=vae.get("scale_factor_temporal", 4),
            vae_spatial=spatial,
            patch_size=patch,
            num_layers=transformer["num_layers"],
            num_heads=transformer["num_attention_heads"],
            head_dim=transformer["attention_head_dim"],
            text_tokens=512,
            defaults=dict(defaults or FAMILY_DEFAULTS[family]),
            path=path,
        )
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    if family == "flux":
        patch = (2, 2)  # the pipeline packs 2x2 latent pixels into one token
        layers = transformer["num_layers"] + transformer["num_single_layers"]
        sample = 128
        text_tokens = 512
    else:
        patch = (transformer["patch_size"],) * 2
        layers = transformer["num_layers"]
        sample = transformer["sample_size"]
        text_tokens = 333  # 77 CLIP + 256 T5 tokens, the pipeline's default max_sequence_length
    if defaults is None:
        defaults = {**FAMILY_DEFAULTS[family], "width": sample * spatial, "height": sample * spatial}
    return ModelSpec(
        name=name,
        family=family,
        is_video=False,
        uses_cfg=family == "sd3",
        size_multiple=spatial * patch[0],
        frame_multiple=1,
        vae_spatial=spatial,
        patch_size=patch,
        num_layers=layers,
        num_heads=transformer["num_attention_heads"],
        head_dim=transformer["attention_head_dim"],
        text_tokens=text_tokens,
        defaults=dict(defaults),
        path=path,
    )


def _preset_specs() -> dict[str, ModelSpec]:
    from genbatch.models import tiny_configs as cfg

    configs = {
        "tiny-wan": ("wan", cfg.TINY_WAN_TRANSFORMER, cfg.TINY_WAN_VAE),
        "tiny-flux": ("flux", cfg.TINY_FLUX_TRANSFORMER, cfg.TINY_FLUX_VAE),
        "tiny-sd3": ("sd3", cfg.TINY_SD3_TRANSFORMER, cfg.TINY_SD3_VAE),
    }
    return {
        name: _spec_from_configs(name, family, transformer, vae, cfg.PRESET_DEFAULTS[name])
        for name, (family, transformer, vae) in configs.items()
    }


def preset_names() -> list[str]:
    return sorted(_preset_specs())


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _spec_from_directory(name: str, path: str | None = None) -> ModelSpec:
    """The spec of the pipeline directory `path` (default: `name` itself), named `name`."""
    path = path or name
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        where = "" if path == name else f" (its snapshot {path})"
        raise UnknownModelError(
            f"model {name!r}{where} is not a preset ({', '.join(preset_names())}), a hub id (org/name) in the "
            "Hugging Face cache, or a directory with a model_index.json; pass a diffusers pipeline directory "
            "saved with save_pretrained"
        )
    index = _read_json(index_path)
    pipeline_class = index.get("_class_name", "")
    family = PIPELINE_FAMILIES.get(pipeline_class)
    if family is None:
        raise UnknownModelError(
            f"model {name!r} is a {pipeline_class or 'pipeline of unknown class'}; genbatch runs "
            f"{', '.join(sorted(PIPELINE_FAMILIES))}"
        )
    try:
        transformer = _read_json(os.path.join(path, "transformer", "config.json"))
        vae = _read_json(os.path.join(path, "vae", "config.json"))
        return _spec_from_configs(name, family, transformer, vae, defaults=None, path=path)
    except (OSError, ValueError, KeyError, TypeError) as error:  # missing or unreadable component configs
        raise UnknownModelError(
            f"model {name!r} is an incomplete {pipeline_class} directory ({type(error).__name__}: {error}); "
            "pass a whole diffusers pipeline directory saved with save_pretrained"
        ) from error


def model_directory(name: str) -> str | None:
    """The local pipeline directory `name` refers to, as diffusers' `from_pretrained` finds it: an existing
    directory of that name wins, else a hub id's snapshot in the Hugging Face cache (never downloaded
    here); None for a preset. Raises `UnknownModelError` for a hub id missing from the cache."""
    if name in _preset_specs():
        return None
    expanded = os.path.expanduser(name)
    hub = None if os.path.isdir(expanded) else parse_hub_id(name)
    if hub is None:
        return expanded
    try:
        return cached_snapshot(hub)
    except HubModelMissing as error:
        raise UnknownModelError(str(error)) from None


@lru_cache(maxsize=64)
def resolve_model(name: str) -> ModelSpec:
    """The spec of a preset, a pipeline directory or a cached hub id; raises `UnknownModelError` naming the fix.

    Cached per name: a manifest's rows resolve each distinct model once."""
    presets = _preset_specs()
    if name in presets:
        return presets[name]
    path = model_directory(name)
    expanded = os.path.expanduser(name)
    return _spec_from_directory(expanded, path) if path == expanded else _spec_from_directory(name, path)
