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
from genbatch.models.hooks import Conditioning, Trajectory
from genbatch.models.spec import ModelSpec
from genbatch.models.tiny import character_tokenizer, seeded, t5_config

MEDIA_INPUTS = ("image", "last_image")


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """Wan's spec, taking an image; the first-and-last-frame model (FLF2V: a transformer whose image context has
    a position embedding over two frames' tokens, `pos_embed_seq_len`) takes and needs both frames."""
    media = MEDIA_INPUTS if transformer.get("pos_embed_seq_len") else ("image",)
    return replace(wan.read_spec(name, transformer, vae, defaults, path), family="wan-i2v", media_inputs=media,
                   media_required=media)


class WanI2VHooks(wan.WanHooks):
    name = "wan-i2v"

    @staticmethod
    def _images(job: JobSpec) -> list:
        return [job.media[column].image for column in MEDIA_INPUTS if column in job.media]

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        conditioning = super().encode(pipe, job, device)
        images = self._images(job)
        # the first frame's CLIP context, or both frames' (first and last) side by side
        embeds = pipe.encode_image(images[0] if len(images) == 1 else images, device).to(self._transformer_dtype(pipe))
        for branch in conditioning.branches.values():
            branch["encoder_hidden_states_image"] = embeds
        return conditioning

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch

        pipe.scheduler.set_timesteps(job.num_inference_steps, device=device)
        frames = [pipe.video_processor.preprocess(image, height=job.height, width=job.width).to(device, torch.float32)
                  for image in self._images(job)]
        latents, condition = pipe.prepare_latents(
            frames[0], 1, pipe.vae.config.z_dim, job.height, job.width, job.num_frames, torch.float32, device,
            generator, None, frames[1] if len(frames) > 1 else None,
        )
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=pipe.scheduler.timesteps,
                          shared={"boundary_timestep": None, "condition": condition})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        # the noise, then the mask and the conditioning video's latents: (b, 16 + 4 + 16, f, h, w)
        model_input = torch.cat([latents, trajectory.shared["condition"]], dim=1).to(self._transformer_dtype(pipe))
        return pipe.transformer(hidden_states=model_input, timestep=t.expand(latents.shape[0]), return_dict=False,
                                **branch)[0]


def _build(transformer_config: Mapping[str, Any], meta: frozenset[str]):
    """Wan 2.1 I2V: WanTransformer3DModel with its image projection, AutoencoderKLWan, UMT5, a CLIP vision
    encoder and its image processor, the UniPC flow scheduler."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

    tokenizer = character_tokenizer(model_max_length=512)
    text_encoder = seeded(0, lambda: UMT5EncoderModel(UMT5Config(**t5_config(len(tokenizer)))), "text_encoder", meta)
    transformer = seeded(1, lambda: WanTransformer3DModel(**transformer_config), "transformer", meta)
    vae = seeded(2, lambda: AutoencoderKLWan(**tiny_configs.TINY_WAN_VAE))
    image_encoder = seeded(3, lambda: CLIPVisionModel(CLIPVisionConfig(**tiny_configs.TINY_CLIP_VISION)))
    size = tiny_configs.TINY_CLIP_VISION["image_size"]
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanImageToVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                                   transformer=transformer, image_encoder=image_encoder,
                                   image_processor=image_processor)


def build_tiny(meta: frozenset[str] = frozenset()):
    """Wan 2.1 I2V (a first frame)."""
    return _build(tiny_configs.TINY_WAN_I2V_TRANSFORMER, meta)


def build_tiny_flf2v(meta: frozenset[str] = frozenset()):
    """Wan 2.1 FLF2V (a first and a last frame)."""
    return _build(tiny_configs.TINY_WAN_FLF2V_TRANSFORMER, meta)


_PLAN = wan.FAMILY.transformers["WanTransformer3DModel"]
TENSOR_PLAN = replace(wan.TENSOR_PLAN, styles={
    **wan.TENSOR_PLAN.styles,
    # the image context's keys and values, split by heads like the text's; their norm spans every head
    "blocks.*.attn2.add_k_proj": COLWISE,
    "blocks.*.attn2.add_v_proj": COLWISE,
    "blocks.*.attn2.norm_added_k": NORM_ACROSS_HEADS,
})
"""Wan's tensor plan, with the cross-attention's image branch split too (its output joins `to_out`'s input,
so the all-reduces a block stay 3)."""
FAMILY = replace(
    wan.FAMILY,
    name="wan-i2v",
    pipelines=("WanImageToVideoPipeline",),
    read_spec=read_spec,
    hooks=WanI2VHooks(),
    transformers={"WanTransformer3DModel": replace(_PLAN, tensor_plan=TENSOR_PLAN)},
    denoisers=("transformer",),
    presets=(TinyPreset(name="tiny-wan-i2v", transformer=tiny_configs.TINY_WAN_I2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan-i2v"],
                        build=build_tiny),
             TinyPreset(name="tiny-wan-flf2v", transformer=tiny_configs.TINY_WAN_FLF2V_TRANSFORMER,
                        vae=tiny_configs.TINY_WAN_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan-i2v"],
                        build=build_tiny_flf2v)),
    published=(),
    teacache=(),
)
