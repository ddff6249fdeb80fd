"""Wan 2.1 image-to-video (`diffusers.WanImageToVideoPipeline`, with its CLIP image encoder), first and last
frame included: everything genbatch knows about the family beyond Wan's own (`genbatch.models.wan`).

The hooks reproduce `WanImageToVideoPipeline.__call__` exactly: the row's image (and `last_image`) is resized
to the row's width x height by the pipeline's own `video_processor.preprocess` (a plain resize to that size:
an image of another aspect ratio is stretched, as diffusers does), encoded by the CLIP vision encoder into
the cross-attention's image context (both guidance branches see it), and the conditioning video (the first
frame, zeros, and the last frame when given) goes through the VAE encoder into the channels concatenated to
the noise at every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import tiny_configs, wan
from genbatch.models.base import COLWISE, NORM_ACROSS_HEADS, TinyPreset
from genbatch.models.shapes import ImageEncode, Published
from genbatch.models.hooks import Conditioning, Trajectory
from genbatch.models.spec import ModelSpec
from genbatch.models.tiny import character_tokenizer, seeded, t5_config

MEDIA_INPUTS = ("image", "last_image")


CLIP_TOKENS = 257
"""The image context's tokens of one image: CLIP ViT-H/14's patches and class token."""
I2V_14B_TRANSFORMER = {**wan.WAN21_14B_TRANSFORMER, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}
"""Wan-AI/Wan2.1-I2V-14B-720P-Diffusers transformer/config.json."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """Wan's spec, taking an image; the first-and-last-frame model (FLF2V: a transformer whose image context has
    a position embedding over two frames' tokens, `pos_embed_seq_len`) takes and needs both frames. A
    transformer whose input is its output's width (Wan 2.2 TI2V, `expand_timesteps`: the image replaces the
    first latent frame rather than riding in extra channels) takes an image and runs without one too."""
    media = MEDIA_INPUTS if transformer.get("pos_embed_seq_len") else ("image",)
    required = () if transformer["in_channels"] == transformer.get("out_channels", transformer["in_channels"]) else media
    spec = wan.read_spec(name, transformer, vae, defaults, path)
    # the cross-attention reads the image context's tokens after the text's: CLIP's 257 an image (FLF2V's two)
    image_tokens = transformer.get("pos_embed_seq_len") or (CLIP_TOKENS if transformer.get("image_dim") else 0)
    return replace(spec, family="wan-i2v", media_inputs=media, media_required=required,
                   text_tokens=spec.text_tokens + image_tokens)


class WanI2VHooks(wan.WanHooks):
    """Wan started from an image: 2.1 I2V and FLF2V (CLIP context, conditioning channels), 2.2 I2V-A14B (two
    experts, no CLIP) and 2.2 TI2V (`expand_timesteps`: the image is the first latent frame, its tokens at
    timestep 0; a row without an image runs text-to-video)."""

    name = "wan-i2v"
    per_row_shared = ("condition",)  # the first-frame mask is the same for every row

    @staticmethod
    def _images(job: JobSpec) -> list:
        return [job.media[column].image for column in MEDIA_INPUTS if column in job.media]

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        conditioning = super().encode(pipe, job, device)
        images = self._images(job)
        if not images or pipe.transformer is None or pipe.transformer.config.image_dim is None:
            return conditioning  # no CLIP image context (Wan 2.2)
        # the first frame's CLIP context, or both frames' (first and last) side by side
        embeds = pipe.encode_image(images[0] if len(images) == 1 else images, device).to(self._transformer_dtype(pipe))
        for branch in conditioning.branches.values():
            branch["encoder_hidden_states_image"] = embeds
        return conditioning

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch
        from diffusers import WanImageToVideoPipeline

        images = self._images(job)
        if not images:  # Wan 2.2 TI2V without an image: text-to-video
            return super().trajectory(pipe, job, generator, device)
        pipe.scheduler.set_timesteps(job.num_inference_steps, device=device)
        frames = [pipe.video_processor.preprocess(image, height=job.height, width=job.width).to(device, torch.float32)
                  for image in images]
        # WanImageToVideoPipeline's own, also for a TI2V directory loaded as a WanPipeline
        prepared = WanImageToVideoPipeline.prepare_latents(
            pipe, frames[0], 1, pipe.vae.config.z_dim, job.height, job.width, job.num_frames, torch.float32, device,
            generator, None, frames[1] if len(frames) > 1 else None,
        )
        pipe.scheduler.set_begin_index(0)
        boundary = pipe.config.boundary_ratio
        shared = {"boundary_timestep": boundary * pipe.scheduler.config.num_train_timesteps if boundary else None,
                  "condition": prepared[1], "first_frame_mask": prepared[2] if len(prepared) > 2 else None}
        return Trajectory(latents=prepared[0], timesteps=pipe.scheduler.timesteps, shared=shared)

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        condition = trajectory.shared.get("condition")
        if condition is None:
            return super().predict(pipe, trajectory, latents, t, step, branch)
        model = self.denoiser_at(pipe, trajectory, t)
        mask = trajectory.shared["first_frame_mask"]
        if mask is None:
            # the noise, then the mask and the conditioning video's latents: (b, 16 + 4 + 16, f, h, w)
            model_input = torch.cat([latents, condition], dim=1)
            timestep = t.expand(latents.shape[0])
        else:
            # TI2V: the image's latents as the first frame, whose tokens are at timestep 0. (b, f * h/2 * w/2)
            model_input = (1 - mask) * condition + mask * latents
            timestep = wan.token_timesteps(mask, t).expand(latents.shape[0], -1)
        return model(hidden_states=model_input.to(self._transformer_dtype(pipe)), timestep=timestep,
                     return_dict=False, **branch)[0]

    def finish(self, pipe, trajectory: Trajectory, latents):
        mask = trajectory.shared.get("first_frame_mask")
        if mask is None:
            return latents
        return (1 - mask) * trajectory.shared["condition"] + mask * latents  # TI2V: the image's frame put back


def _build(transformer_config: Mapping[str, Any], meta: frozenset[str], *, clip: bool = True,
           experts: int = 1, vae_config: Mapping[str, Any] = tiny_configs.TINY_WAN_VAE, **pipeline_config):
    """A tiny WanImageToVideoPipeline: WanTransformer3DModel(s), AutoencoderKLWan, UMT5, the UniPC flow scheduler,
    and a CLIP vision encoder with its image processor (`clip`: Wan 2.1)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

    tokenizer = character_tokenizer(model_max_length=512)
    text_encoder = seeded(0, lambda: UMT5EncoderModel(UMT5Config(**t5_config(len(tokenizer)))), "text_encoder", meta)
    transformer = seeded(1, lambda: WanTransformer3DModel(**transformer_config), "transformer", meta)
    vae = seeded(2, lambda: AutoencoderKLWan(**vae_config))
    image_encoder = image_processor = transformer_2 = None
    if clip:
        image_encoder = seeded(3, lambda: CLIPVisionModel(CLIPVisionConfig(**tiny_configs.TINY_CLIP_VISION)))
        size = tiny_configs.TINY_CLIP_VISION["image_size"]
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    if experts == 2:  # Wan 2.2's low-noise expert, below the boundary timestep
        transformer_2 = seeded(4, lambda: WanTransformer3DModel(**transformer_config), "transformer_2", meta)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                                   transformer=transformer, image_encoder=image_encoder,
                                   image_processor=image_processor, transformer_2=transformer_2, **pipeline_config)


def build_tiny(meta: frozenset[str] = frozenset()):
    """Wan 2.1 I2V (a first frame)."""
    return _build(tiny_configs.TINY_WAN_I2V_TRANSFORMER, meta)


def build_tiny_flf2v(meta: frozenset[str] = frozenset()):
    """Wan 2.1 FLF2V (a first and a last frame)."""
    return _build(tiny_configs.TINY_WAN_FLF2V_TRANSFORMER, meta)


def build_tiny_wan22_i2v(meta: frozenset[str] = frozenset()):
    """Wan 2.2 I2V-A14B: two experts (the high-noise one above 0.9 of the schedule), no CLIP."""
    return _build(tiny_configs.TINY_WAN22_I2V_TRANSFORMER, meta, clip=False, experts=2, boundary_ratio=0.9)


def build_tiny_wan22_ti2v(meta: frozenset[str] = frozenset()):
    """Wan 2.2 TI2V-5B: one transformer, Wan 2.2's VAE, per-token timesteps (`expand_timesteps`), no CLIP."""
    return _build(tiny_configs.TINY_WAN22_TI2V_TRANSFORMER, meta, clip=False, vae_config=tiny_configs.TINY_WAN22_VAE,
                  expand_timesteps=True)


_WAN_PARTS = wan.FAMILY.transformers["WanTransformer3DModel"]
TENSOR_SPLITS = replace(wan.TENSOR_SPLITS, styles={
    **wan.TENSOR_SPLITS.styles,
    # the image context's keys and values, split by heads like the text's; their norm spans every head
    "blocks.*.attn2.add_k_proj": COLWISE,
    "blocks.*.attn2.add_v_proj": COLWISE,
    "blocks.*.attn2.norm_added_k": NORM_ACROSS_HEADS,
})
"""Wan's tensor splits, with the cross-attention's image branch split too (its output joins `to_out`'s input,
so the all-reduces a block stay 3)."""
FAMILY = replace(
    wan.FAMILY,
    name="wan-i2v",
    pipelines=("WanImageToVideoPipeline",),
    read_spec=read_spec,
    hooks=WanI2VHooks(),
    # the conditioning video (first frame, zeros, last frame) at the output's size and frames; Wan 2.2 TI2V, whose
    # image is optional, encodes the image alone (`genbatch.planner.conditioning` tells them apart by the spec)
    image_encode=ImageEncode(video=True),
    transformers={"WanTransformer3DModel": replace(_WAN_PARTS, tensor_splits=TENSOR_SPLITS)},
    denoisers=("transformer",),
    presets=(TinyPreset(name="tiny-wan-i2v", transformer=tiny_configs.TINY_WAN_I2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan-i2v"],
                        build=build_tiny),
             TinyPreset(name="tiny-wan-flf2v", transformer=tiny_configs.TINY_WAN_FLF2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan-i2v"],
                        build=build_tiny_flf2v),
             TinyPreset(name="tiny-wan22-i2v", transformer=tiny_configs.TINY_WAN22_I2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan-i2v"],
                        build=build_tiny_wan22_i2v),
             TinyPreset(name="tiny-wan22-ti2v", transformer=tiny_configs.TINY_WAN22_TI2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN22_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan22-ti2v"],
                        build=build_tiny_wan22_ti2v)),
    vae_costs=wan.FAMILY.vae_costs,
    published=(
        # Wan 2.1 14B with 36 input channels and the image context's cross-attention K/V (16.39B, counted on its
        # config); the CLIP ViT-H/14 vision encoder (0.63B) stays beside UMT5-XXL
        Published(name="wan2.1-i2v-14b", hub_id="Wan-AI/Wan2.1-I2V-14B-720P-Diffusers",
                  transformer=I2V_14B_TRANSFORMER, vae=wan.WAN21_VAE,
                  defaults={**wan.CALL_DEFAULTS, "width": 1280, "height": 720}, parameters=16.39e9,
                  text_encoder_parameters=6.31e9, vae_parameters=0.127e9),
    ),
    teacache=(),
)
