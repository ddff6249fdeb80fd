"""The transformer and VAE facts the cost model needs, for published models by name or any `ModelSpec`.

Published shapes come from each model's diffusers `transformer/config.json` on the Hub (layers, heads, head
dim, FFN width, patch) and its model card (parameters, defaults); text-encoder and VAE sizes from their
configs. Presets and diffusers directories go through `genbatch.jobs.models.resolve_model` and, for a
directory, the safetensors headers (parameter counts, read without loading weights).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, replace

from genbatch.jobs.models import ModelSpec, UnknownModelError
from genbatch.models import resolve_model

IMAGE_VAE_MFLOP_PER_PIXEL = 9.9
"""FLUX/SD3 AutoencoderKL decoder (channels 512,512,256,128; 3 resnets a stage): counting its 3x3 convs gives
10.4 TFLOP for a 1024x1024 image, 9.9 MFLOP per output pixel."""
WAN_VAE_MFLOP_PER_PIXEL = 8.5
"""Wan 2.1 VAE decoder (channels 384,384,192,96; 3x3x3 causal convs, 3 resnets a stage): 8.5 MFLOP per output
pixel and frame, counted the same way."""
HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL = 25.0
"""HunyuanVideo and CogVideoX 3D VAE decoders (channels 512,512,256,128 with 3x3x3 convs): about 25 MFLOP per
output pixel and frame, counted the same way."""
IMAGE_VAE_GIB_PER_MPX = 2.0 / 1.048576
"""VAE decode peak memory for images: seed 000 §7.1, 2 GiB at 1024x1024 and 8 GiB at 2048x2048."""
VIDEO_VAE_GIB_PER_MPX = 107.0 / (1280 * 720 * 81 / 1e6)
"""VAE decode peak for video, per million pixel-frames: seed 000 §7.1, 107 GiB for Wan 720p 81 frames
(used for the other video VAEs too, which publish no figure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """One model as the cost model sees it."""

    name: str
    """The name it was asked for by."""
    is_video: bool
    """True when outputs are videos (frames count)."""
    uses_cfg: bool
    """True when each step runs a conditional and an unconditional forward (CFG parallel applies)."""
    num_layers: int
    """Transformer blocks, all kinds together."""
    num_heads: int
    """Attention heads (Ulysses and TP degrees must divide it)."""
    head_dim: int
    """Channels per head; hidden size = heads x head dim."""
    ffn_dim: int
    """MLP inner width."""
    parameters: float
    """Transformer parameters."""
    text_encoder_parameters: float
    """Parameters of all text encoders together (kept on every rank)."""
    vae_parameters: float
    """VAE parameters."""
    joint_text: bool
    """True when text tokens join the image tokens in self-attention (MMDiT); False for cross-attention (Wan)."""
    text_tokens: int
    """Text tokens per prompt."""
    patch_size: tuple[int, ...]
    """Transformer patch over the latent: (t, h, w) for video, (h, w) for images."""
    vae_spatial: int
    """Pixels per latent pixel, along height and width."""
    vae_temporal: int
    """Frames per latent frame (video); 1 for images."""
    out_channels: int
    """Latent channels the transformer predicts per latent pixel (the CFG exchange carries these)."""
    vae_mflop_per_pixel: float
    """VAE decode work per output pixel (and frame), MFLOP."""
    vae_gib_per_mpx: float
    """VAE decode peak memory per million output pixels (and frames), GiB."""
    width: int
    """Default width."""
    height: int
    """Default height."""
    frames: int | None
    """Default frames (video), None for images."""
    steps: int
    """Default denoising steps."""

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    def image_tokens(self, width: int, height: int, frames: int | None) -> int:
        """Tokens of the latent after patching; a partial patch is padded up."""
        extents = [math.ceil(height / self.vae_spatial), math.ceil(width / self.vae_spatial)]
        if self.is_video:
            extents.insert(0, (max(frames or 1, 1) - 1) // self.vae_temporal + 1)
        count = 1
        for extent, patch in zip(extents, self.patch_size[-len(extents):]):
            count *= math.ceil(extent / patch)
        return count

    def sequence(self, width: int, height: int, frames: int | None) -> int:
        """Tokens in self-attention: image tokens, plus text tokens for MMDiT models."""
        return self.image_tokens(width, height, frames) + (self.text_tokens if self.joint_text else 0)


def _shape(**fields) -> ModelShape:
    return ModelShape(**fields)


_FLUX_COMMON = dict(is_video=False, num_heads=24, head_dim=128, patch_size=(2, 2), vae_spatial=8, vae_temporal=1,
                    out_channels=16, vae_mflop_per_pixel=IMAGE_VAE_MFLOP_PER_PIXEL,
                    vae_gib_per_mpx=IMAGE_VAE_GIB_PER_MPX, frames=None)
_WAN_COMMON = dict(is_video=True, uses_cfg=True, head_dim=128, patch_size=(1, 2, 2), vae_spatial=8, vae_temporal=4,
                   out_channels=16, joint_text=False, text_tokens=512, text_encoder_parameters=5.68e9,
                   vae_parameters=0.127e9, vae_mflop_per_pixel=WAN_VAE_MFLOP_PER_PIXEL,
                   vae_gib_per_mpx=VIDEO_VAE_GIB_PER_MPX, frames=81, steps=50)
_COGVIDEOX_COMMON = dict(is_video=True, uses_cfg=True, num_layers=42, num_heads=48, head_dim=64, ffn_dim=12288,
                         parameters=5.57e9, text_encoder_parameters=4.76e9, vae_parameters=0.216e9, joint_text=True,
                         text_tokens=226, vae_spatial=8, vae_temporal=4, out_channels=16,
                         vae_mflop_per_pixel=HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL, vae_gib_per_mpx=VIDEO_VAE_GIB_PER_MPX,
                         steps=50)

# Text encoders: T5-XXL encoder 4.76B, CLIP-L 0.12B, OpenCLIP-bigG 0.69B, UMT5-XXL encoder 5.68B,
# Llava-Llama-3-8B text model 7.5B, Qwen2.5-VL-7B 8.29B.
PUBLISHED: dict[str, ModelShape] = {
    "flux.1-dev": _shape(name="flux.1-dev", uses_cfg=False, num_layers=19 + 38, ffn_dim=12288, parameters=11.9e9,
                         text_encoder_parameters=4.88e9, vae_parameters=0.084e9, joint_text=True, text_tokens=512,
                         width=1024, height=1024, steps=28, **_FLUX_COMMON),
    "sd3-medium": _shape(name="sd3-medium", is_video=False, uses_cfg=True, num_layers=24, num_heads=24, head_dim=64,
                         ffn_dim=6144, parameters=2.03e9, text_encoder_parameters=5.58e9, vae_parameters=0.084e9,
                         joint_text=True, text_tokens=77 + 256, patch_size=(2, 2), vae_spatial=8, vae_temporal=1,
                         out_channels=16, vae_mflop_per_pixel=IMAGE_VAE_MFLOP_PER_PIXEL,
                         vae_gib_per_mpx=IMAGE_VAE_GIB_PER_MPX, width=1024, height=1024, frames=None, steps=28),
    "wan2.1-1.3b": _shape(name="wan2.1-1.3b", num_layers=30, num_heads=12, ffn_dim=8960, parameters=1.42e9,
                          width=832, height=480, **_WAN_COMMON),
    "wan2.1-14b": _shape(name="wan2.1-14b", num_layers=40, num_heads=40, ffn_dim=13824, parameters=14.29e9,
                         width=1280, height=720, **_WAN_COMMON),
    "hunyuanvideo": _shape(name="hunyuanvideo", is_video=True, uses_cfg=False, num_layers=20 + 40, num_heads=24,
                           head_dim=128, ffn_dim=12288, parameters=12.8e9, text_encoder_parameters=7.62e9,
                           vae_parameters=0.246e9, joint_text=True, text_tokens=256, patch_size=(1, 2, 2),
                           vae_spatial=8, vae_temporal=4, out_channels=16,
                           vae_mflop_per_pixel=HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL, vae_gib_per_mpx=VIDEO_VAE_GIB_PER_MPX,
                           width=1280, height=720, frames=129, steps=50),
    "cogvideox-5b": _shape(name="cogvideox-5b", patch_size=(1, 2, 2), width=720, height=480, frames=49,
                           **_COGVIDEOX_COMMON),
    "cogvideox1.5-5b": _shape(name="cogvideox1.5-5b", patch_size=(2, 2, 2), width=1360, height=768, frames=81,
                              **_COGVIDEOX_COMMON),
    "qwen-image": _shape(name="qwen-image", uses_cfg=True, num_layers=60, ffn_dim=12288, parameters=20.4e9,
                         text_encoder_parameters=8.29e9, vae_parameters=0.127e9, joint_text=True, text_tokens=256,
                         width=1024, height=1024, steps=50, **_FLUX_COMMON),
}


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


def _read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _preset_transformer(name: str) -> dict:
    from genbatch.models import tiny_configs

    return {"tiny-wan": tiny_configs.TINY_WAN_TRANSFORMER, "tiny-flux": tiny_configs.TINY_FLUX_TRANSFORMER}.get(
        name, {}
    )


def shape_from_spec(spec: ModelSpec) -> ModelShape:
    """The shape of a preset or a diffusers directory, read from its configs and safetensors headers."""
    root = spec.path if spec.path and os.path.isdir(spec.path) else None  # a preset has no directory
    transformer = _read_config(os.path.join(root, "transformer")) if root else _preset_transformer(spec.name)
    d = spec.hidden_size
    ffn = int(transformer.get("ffn_dim") or 4 * d)  # FLUX and SD3 blocks use an MLP ratio of 4
    cross = spec.family == "wan"
    # Without weights on disk: attention (and cross-attention) projections plus the MLP.
    estimate = spec.num_layers * (4 * d * d * (2 if cross else 1) + 2 * d * ffn)
    parameters = spec.parameters or (root and _safetensors_parameters(os.path.join(root, "transformer"))) or estimate
    text = sum(_safetensors_parameters(os.path.join(root, sub)) or 0.0
               for sub in ("text_encoder", "text_encoder_2", "text_encoder_3")) if root else 0.0
    vae = (_safetensors_parameters(os.path.join(root, "vae")) or 0.0) if root else 0.0
    defaults = spec.defaults
    return ModelShape(
        name=spec.name,
        is_video=spec.is_video,
        uses_cfg=spec.uses_cfg,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        head_dim=spec.head_dim,
        ffn_dim=ffn,
        parameters=float(parameters),
        text_encoder_parameters=float(text),
        vae_parameters=float(vae),
        joint_text=not cross,
        text_tokens=spec.text_tokens,
        patch_size=tuple(spec.patch_size),
        vae_spatial=spec.vae_spatial,
        vae_temporal=spec.frame_multiple if spec.is_video else 1,
        out_channels=int(transformer.get("out_channels") or 16),
        vae_mflop_per_pixel=WAN_VAE_MFLOP_PER_PIXEL if spec.is_video else IMAGE_VAE_MFLOP_PER_PIXEL,
        vae_gib_per_mpx=VIDEO_VAE_GIB_PER_MPX if spec.is_video else IMAGE_VAE_GIB_PER_MPX,
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
