"""HunyuanVideo 1.5 text-to-video (`diffusers.HunyuanVideo15Pipeline`): everything genbatch knows about the family.

`HunyuanVideo15Transformer3DModel` (8.3B) runs 54 dual-stream blocks, each with one joint attention over
[video, text] tokens. The text is three streams joined before the blocks, valid tokens first:
- a Qwen2.5-VL language model's `hidden_states[-3]` of the prompt in a chat template (a system prompt of 108
  tokens, cropped off after the encode), padded to 1000 tokens;
- ByT5 (a `T5EncoderModel`) of the prompt's quoted text (`"..."`, as `Text "...". `), 256 tokens, all masked
  (zeros) when the prompt quotes nothing;
- the image tokens: 729 zeros, masked, for text-to-video (the I2V pipeline's SigLIP features,
  `genbatch.models.hunyuan_video15_i2v`).
Every block attends over the video and those 1985 text tokens behind the text's key-padding mask (the processor
builds its mask as the outer product of a per-token mask: a padded token neither attends nor is attended to).

**Guidance.** The pipeline takes no `guidance_scale`: its `guider` component (a `ClassifierFreeGuidance`) holds
it, and the pipeline runs the unconditional branch (the negative prompt, or an empty one) when the guider is
enabled and its scale is not 1. A row's `guidance_scale` is that guider's scale: the model's own guider config
gives the default (6.0 for the published models, 1.0 for the distilled ones), and a row may set another. A
guider configured beyond plain CFG (a guidance rescale, the original formulation, a start/stop window of steps,
another guider class) is refused at the row's encode, naming the setting, rather than run otherwise.

**Latents.** The noise is drawn in the transformer's dtype, as the pipeline draws it, and every forward takes
[noise, conditioning latents, mask] along the channels: zeros for text-to-video (65 = 32 + 32 + 1 channels).

**Parallelism.** Sequence parallelism (ulysses, ring) splits the video and the joined text at the first block,
with the text's mask and the video's rotary tables; tensor parallelism splits the blocks' heads, MLPs and AdaLN
modulations (genbatch's split points: diffusers has neither). CFG parallel puts the two guider branches on the cfg
halves. The VAE (`AutoencoderKLHunyuanVideo15`) decodes (and, for I2V, encodes) patch-parallel, exactly, with
halos that replicate only at the true image border (`vae_rules.AUTOENCODER_KL_HUNYUAN_VIDEO15`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import hunyuan_video15_tiny as tiny
from genbatch.models import vae_costs, vae_rules
from genbatch.models.base import (
    GATHERED_COLWISE,
    JOINT,
    T5_ENCODER,
    T5_TENSOR_SPLITS,
    AttentionSite,
    Blocks,
    Gather,
    ModelFamily,
    SequenceSplits,
    Split,
    TensorSplits,
    TinyPreset,
    TransformerParts,
    decoder_tensor_splits,
    dual_stream_styles,
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, Trajectory, classifier_free_guidance
from genbatch.models.shapes import Published
from genbatch.models.spec import ModelSpec

QWEN_TOKENS = 1000
"""The prompt's tokens after the template's crop (the pipeline's `tokenizer_max_length`)."""
GLYPH_TOKENS = 256
"""ByT5's tokens (the pipeline's `tokenizer_2_max_length`)."""
IMAGE_TOKENS = 729
"""The image tokens (the pipeline's `vision_num_semantic_tokens`: SigLIP's 27 x 27)."""
TEXT_TOKENS = QWEN_TOKENS + GLYPH_TOKENS + IMAGE_TOKENS
"""The text tokens every block attends to, valid or padded."""

CALL_DEFAULTS = {"width": None, "height": None, "num_frames": 121, "num_inference_steps": 50, "guidance_scale": None,
                 "fps": 24}
"""HunyuanVideo15Pipeline.__call__'s defaults: the size is the 16:9 bucket of the transformer's `target_size`
(848 x 480 at 640, 1280 x 720 at 960), the guidance scale the guider's (fps: the published models' 24)."""

# The published models' configs (huggingface/diffusers scripts/convert_hunyuan_video1_5_to_diffusers.py,
# TRANSFORMER_CONFIGS, SCHEDULER_CONFIGS and GUIDANCE_CONFIGS; the VAE: AutoencoderKLHunyuanVideo15's defaults,
# which the script builds it with), as hunyuanvideo-community/HunyuanVideo-1.5-{480p,720p}_{t2v,i2v} ship them. The
# script leaves 720p_i2v's transformer config empty: here the 720p one with task_type "i2v" (the 480p pair differs
# only by task_type).
PUBLISHED_TRANSFORMER = dict(in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128,
                             num_layers=54, num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
                             qk_norm="rms_norm", text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152,
                             rope_theta=256.0, rope_axes_dim=(16, 56, 56), use_meanflow=False)
PUBLISHED_VAE = dict(in_channels=3, out_channels=3, latent_channels=32, block_out_channels=(128, 256, 512, 1024, 1024),
                     layers_per_block=2, spatial_compression_ratio=16, temporal_compression_ratio=4,
                     scaling_factor=1.03682)
PUBLISHED_CONFIG = {
    "480p_t2v": dict(transformer=dict(PUBLISHED_TRANSFORMER, target_size=640, task_type="t2v"), vae=PUBLISHED_VAE,
                     scheduler=dict(shift=5.0), guider=dict(guidance_scale=6.0)),
    "720p_t2v": dict(transformer=dict(PUBLISHED_TRANSFORMER, target_size=960, task_type="t2v"), vae=PUBLISHED_VAE,
                     scheduler=dict(shift=9.0), guider=dict(guidance_scale=6.0)),
    "480p_i2v": dict(transformer=dict(PUBLISHED_TRANSFORMER, target_size=640, task_type="i2v"), vae=PUBLISHED_VAE,
                     scheduler=dict(shift=5.0), guider=dict(guidance_scale=6.0)),
    "720p_i2v": dict(transformer=dict(PUBLISHED_TRANSFORMER, target_size=960, task_type="i2v"), vae=PUBLISHED_VAE,
                     scheduler=dict(shift=7.0), guider=dict(guidance_scale=6.0)),
}
"""The published checkpoints' component configs, by the conversion script's names."""
HUB_IDS = {name: f"hunyuanvideo-community/HunyuanVideo-1.5-{name}" for name in PUBLISHED_CONFIG}
"""Their diffusers repositories (`gen run --model hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v`, found in the
Hugging Face cache like any hub id)."""


def crop_sizes(base_size: int, patch_size: int, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """The pipeline's size buckets (its `generate_crop_size_list`): (height, width) pairs of about `base_size`^2
    pixels, multiples of `patch_size`, aspect ratios up to `max_ratio`."""
    patches = round((base_size / patch_size) ** 2)
    sizes, wide, high = [], patches, 1
    while wide > 0:
        if max(wide, high) / min(wide, high) <= max_ratio:
            sizes.append((wide * patch_size, high * patch_size))
        if (high + 1) * wide <= patches:
            high += 1
        else:
            wide -= 1
    return sizes


def bucket_size(height: float, width: float, target_size: int, multiple: int) -> tuple[int, int]:
    """(height, width) of the bucket the pipeline gives a `height` x `width` aspect ratio (its
    `calculate_default_height_width`): the bucket of the nearest ratio on the same side of square."""
    sizes = crop_sizes(target_size, multiple)
    ratio = float(height) / float(width)
    gaps = [round(h / w, 5) - ratio for h, w in sizes]
    side = [(index, gap) for index, gap in enumerate(gaps) if (gap <= 0 if ratio >= 1 else gap >= 0)]
    return sizes[min(side, key=lambda pair: abs(pair[1]))[0]]


GUIDER_CONFIG = os.path.join("guider", "guider_config.json")
"""Where a saved pipeline keeps its guider's config (diffusers' `BaseGuidance.config_name`)."""


def _guider_config(path: str | None) -> dict:
    """The pipeline directory's guider config ({} without one)."""
    if path is None:
        return {}
    try:
        with open(os.path.join(path, GUIDER_CONFIG), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial, temporal = vae.get("spatial_compression_ratio", 16), vae.get("temporal_compression_ratio", 4)
    patch = (transformer.get("patch_size_t", 1), transformer.get("patch_size", 1), transformer.get("patch_size", 1))
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    guider = _guider_config(path)
    if defaults is None:
        height, width = bucket_size(9, 16, transformer.get("target_size", 640), spatial)
        defaults = {**CALL_DEFAULTS, "width": width, "height": height,
                    "guidance_scale": float(guider.get("guidance_scale", 7.5))}
    return ModelSpec(
        name=name,
        family="hunyuan-video-15",
        is_video=True,
        uses_cfg=bool(guider.get("enabled", True)),
        size_multiple=spatial * patch[1],
        frame_multiple=temporal,
        vae_spatial=spatial,
        patch_size=patch,
        num_layers=transformer["num_layers"],
        num_heads=heads,
        head_dim=head_dim,
        text_tokens=TEXT_TOKENS,
        joint_text=True,
        ffn_dim=int(heads * head_dim * transformer.get("mlp_ratio", 4.0)),
        out_channels=int(transformer.get("out_channels") or 32),
        defaults=dict(defaults),
        path=path,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer({"transformer_blocks": transformer["num_layers"]}),
    )


def runs_cfg(pipe, job: JobSpec) -> bool:
    """Whether the pipeline's guider runs the unconditional branch for the row's guidance scale (its scale not 1,
    the guider enabled); ValueError naming the setting for a guider genbatch does not reproduce."""
    guider = pipe.guider
    if type(guider).__name__ != "ClassifierFreeGuidance":
        raise ValueError(f"model {job.model}: genbatch runs HunyuanVideo 1.5 with a ClassifierFreeGuidance guider, not "
                         f"{type(guider).__name__}; save the pipeline with diffusers' ClassifierFreeGuidance")
    config = guider.config
    odd = {key: config[key] for key, plain in (("guidance_rescale", 0.0), ("use_original_formulation", False),
                                               ("start", 0.0), ("stop", 1.0)) if config[key] != plain}
    if odd:
        raise ValueError(f"model {job.model}: its guider sets {odd}; genbatch runs the guider as plain CFG "
                         f"(guidance_rescale 0, diffusers' formulation, every step): set those back in {GUIDER_CONFIG}")
    return bool(guider._enabled) and not math.isclose(job.guidance_scale, 1.0)


class HunyuanVideo15Hooks(FamilyHooks):
    name = "hunyuan-video-15"
    per_row_shared = ("cond_latents", "mask")

    def image_embeds(self, pipe, job: JobSpec, device):
        """The image tokens every forward takes: zeros for text-to-video (the pipeline's (1, 729, d))."""
        import torch

        return torch.zeros(1, pipe.vision_num_semantic_tokens, pipe.vision_states_dim, dtype=pipe.transformer.dtype,
                           device=device)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        dtype = pipe.transformer.dtype
        texts = {COND: job.prompt, **({UNCOND: job.negative_prompt} if runs_cfg(pipe, job) else {})}
        image_embeds = self.image_embeds(pipe, job, device)
        branches = {}
        for branch, text in texts.items():
            # the Qwen text (1, 1000, d) and the glyph text (1, 256, d_2) with their masks; None encodes ""
            embeds, mask, embeds_2, mask_2 = pipe.encode_prompt(prompt=text, device=device, dtype=dtype, batch_size=1,
                                                                num_videos_per_prompt=1)
            branches[branch] = {"encoder_hidden_states": embeds, "encoder_attention_mask": mask,
                                "encoder_hidden_states_2": embeds_2, "encoder_attention_mask_2": mask_2,
                                "image_embeds": image_embeds}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def size(self, pipe, job: JobSpec) -> tuple[int, int]:
        """(height, width) of the video: the row's."""
        return job.height, job.width

    def conditioning(self, pipe, job: JobSpec, latents, height: int, width: int, device):
        """(latents of the conditioning frames, their mask), each (1, c or 1, f, h, w): zeros for text-to-video."""
        return pipe.prepare_cond_latents_and_mask(latents, pipe.transformer.dtype, device)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import numpy as np
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import retrieve_timesteps

        height, width = self.size(pipe, job)
        steps = job.num_inference_steps
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
        # (1, c, (f - 1) / 4 + 1, h / 16, w / 16), drawn in the transformer's dtype as the pipeline draws it
        latents = pipe.prepare_latents(1, pipe.num_channels_latents, height, width, job.num_frames,
                                       pipe.transformer.dtype, device, generator)
        cond_latents, mask = self.conditioning(pipe, job, latents, height, width, device)
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared={"cond_latents": cond_latents, "mask": mask})

    def timestep_r(self, pipe, trajectory: Trajectory, latents, step: int):
        """The second timestep of a MeanFlow transformer (None: text-to-video never passes one)."""
        return None

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        shared = trajectory.shared
        # (b, c, f, h, w) x 2 + (b, 1, f, h, w) -> (b, 2c + 1, f, h, w): the noise, the conditioning, the mask
        model_input = torch.cat([latents, shared["cond_latents"], shared["mask"]], dim=1)
        timestep = t.expand(model_input.shape[0]).to(model_input.dtype)
        extra = {}
        timestep_r = self.timestep_r(pipe, trajectory, latents, step)
        if timestep_r is not None:
            extra["timestep_r"] = timestep_r
        return pipe.transformer(hidden_states=model_input, timestep=timestep, attention_kwargs=None,
                                return_dict=False, **extra, **branch)[0]

    def combine(self, predictions, guidance_scale: float, t):
        # the guider's: uncond + scale * (cond - uncond); the conditional prediction alone without CFG
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents):
        vae = pipe.vae
        return latents.to(device=next(vae.parameters()).device, dtype=vae.dtype) / vae.config.scaling_factor

    def postprocess(self, pipe, decoded):
        # (1, c, f, h, w) -> (f, h, w, c) in [0, 1]
        return pipe.video_processor.postprocess_video(decoded, output_type="np")[0]


TENSOR_SPLITS = TensorSplits(
    styles={**dual_stream_styles("transformer_blocks"), "norm_out.linear": GATHERED_COLWISE},
    all_reduces={"transformer_blocks": 2},
)
"""HunyuanVideo 1.5's tensor splits (diffusers has none): each dual-stream block's q, k, v of both streams by heads
(its QK norms are per head, so they split with them), both output projections and both MLPs row-wise, both AdaLN
modulations gathered, and the final modulation; the token refiner, the glyph and image projections run once on
the text, whole on every rank."""

TRANSFORMER_PARTS = TransformerParts(
    blocks=Blocks(before=("x_embedder", "image_embedder", "context_embedder", "context_embedder_2", "time_embed",
                          "cond_type_embed", "rope"),
                  repeated=("transformer_blocks",), after=("norm_out", "proj_out")),
    # joint attention over [video, text] in every dual-stream block, behind the text's key-padding mask; the token
    # refiner's self-attention (inside `context_embedder`) runs on the whole text before any split
    attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT,
                             streams=("hidden_states", "encoder_hidden_states"), masked=True),),
    # diffusers has no split points for it: the video and the joined text split at the first block (after the transformer
    # has put each row's valid text tokens first), the video's rotary tables with the video, and the text's mask at
    # every block's attention (each block is handed the whole mask): each rank's processor pads its share of the
    # mask with its video tokens, a mask of this rank's keys, which the attention gathers
    sequence=SequenceSplits(points={
        "transformer_blocks.0": {"hidden_states": Split(dim=1, expected_dims=3),
                                 "encoder_hidden_states": Split(dim=1, expected_dims=3)},
        "transformer_blocks.*.attn": {"attention_mask": Split(dim=1, expected_dims=2)},
        "rope": {0: Split(dim=0, expected_dims=2, output=True), 1: Split(dim=0, expected_dims=2, output=True)},
        "proj_out": Gather(dim=1, expected_dims=3),
    }),
    tensor_splits=TENSOR_SPLITS,
    # diffusers' _repeated_blocks name the dual-stream block (and the patch embedding and token refiner, run once)
    compile_units=("transformer_blocks.*",),
)

QWEN_TEXT_ENCODER = Blocks(before=("embed_tokens",), repeated=("layers",), after=("norm",))
"""`Qwen2_5_VLTextModel`: the language model alone (no vision tower, no LM head)."""

TEXT_ENCODER_PARAMETERS = 7.07e9 + 0.22e9
"""Qwen2.5-VL-7B's language model (7.07B) and ByT5-small's encoder as the pipeline loads it (0.22B)."""


def published(name: str, config: str, text_encoder_parameters: float = TEXT_ENCODER_PARAMETERS) -> Published:
    """A published HunyuanVideo 1.5 model from its checkpoint's configs (`PUBLISHED_CONFIG[config]`): the
    transformer counted on its config (8.33B), the VAE (1.26B: decoder 0.87B, encoder 0.39B); its default size is
    the 16:9 bucket of its `target_size`, its guidance the guider's."""
    configs = PUBLISHED_CONFIG[config]
    height, width = bucket_size(9, 16, configs["transformer"]["target_size"], PUBLISHED_VAE["spatial_compression_ratio"])
    return Published(name=name, hub_id=HUB_IDS[config], transformer=configs["transformer"], vae=configs["vae"],
                     defaults={**CALL_DEFAULTS, "width": width, "height": height,
                               "guidance_scale": configs["guider"]["guidance_scale"]},
                     parameters=8.33e9, text_encoder_parameters=text_encoder_parameters, vae_parameters=1.26e9)


FAMILY = ModelFamily(
    name="hunyuan-video-15",
    pipelines=("HunyuanVideo15Pipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=HunyuanVideo15Hooks(),
    transformers={"HunyuanVideo15Transformer3DModel": TRANSFORMER_PARTS},
    text_encoders={"Qwen2_5_VLTextModel": QWEN_TEXT_ENCODER, "T5EncoderModel": T5_ENCODER},
    text_encoder_splits={"Qwen2_5_VLTextModel": decoder_tensor_splits("layers"), "T5EncoderModel": T5_TENSOR_SPLITS},
    vae_classes=("diffusers:AutoencoderKLHunyuanVideo15",),
    vae_rules=vae_rules.AUTOENCODER_KL_HUNYUAN_VIDEO15,
    presets=(TinyPreset(name="tiny-hunyuan-video-15", transformer=tiny.TINY_TRANSFORMER, vae=tiny.TINY_VAE,
                        defaults=tiny.TINY_DEFAULTS, build=tiny.build_tiny),),
    vae_costs=vae_costs.HUNYUAN_VIDEO15_VAE,
    published=(published("hunyuanvideo-1.5-480p", "480p_t2v"), published("hunyuanvideo-1.5-720p", "720p_t2v")),
)
