"""Wan 2.1 / 2.2 text-to-video (`diffusers.WanPipeline`): everything genbatch knows about the family.

The denoise hooks reproduce `WanPipeline.__call__` exactly (Wan 2.2's second expert below the boundary
timestep, TI2V's per-token timesteps included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models import tiny_configs, vae_costs, vae_rules
from genbatch.models.base import (
    COLWISE,
    CROSS,
    GATHERED_COLWISE,
    HEADS,
    NORM_ACROSS_HEADS,
    ROWWISE,
    SELF,
    T5_ENCODER,
    T5_TENSOR_SPLITS,
    AttentionSite,
    Blocks,
    ModelFamily,
    TeaCacheModel,
    SequenceSplits,
    TensorSplits,
    TinyPreset,
    TransformerParts,
    transformer_spec,
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, Trajectory, classifier_free_guidance
from genbatch.models.shapes import Published
from genbatch.models.tiny import character_tokenizer, seeded, t5_config

MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default

CALL_DEFAULTS = {"width": 832, "height": 480, "num_frames": 81, "num_inference_steps": 50, "guidance_scale": 5.0,
                 "fps": 16}
"""WanPipeline.__call__'s defaults (fps: the pipeline's export default)."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = vae.get("scale_factor_spatial", 8)
    patch = tuple(transformer["patch_size"])
    spec = transformer_spec(
        name, "wan", transformer, defaults=defaults or CALL_DEFAULTS, path=path, is_video=True, uses_cfg=True,
        size_multiple=spatial * patch[1], frame_multiple=vae.get("scale_factor_temporal", 4), vae_spatial=spatial,
        patch_size=patch, num_layers=transformer["num_layers"], text_tokens=MAX_SEQUENCE_LENGTH, joint_text=False,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer({"blocks": transformer["num_layers"]}),
    )
    if path is not None and _expands_timesteps(path):
        # Wan 2.2 TI2V saved as a WanPipeline: it also starts from an image (the wan-i2v hooks run both)
        return replace(spec, family="wan-i2v", media_inputs=("image",))
    return spec


def _expands_timesteps(path: str) -> bool:
    import json
    import os

    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        return bool(json.load(handle).get("expand_timesteps"))


def token_timesteps(mask, t):
    """Wan 2.2 TI2V's one timestep per token, as its pipelines compute it: `t` scaled by the mask (0 on the
    image's first frame), one per 2x2 patch. mask (b, 1 or c, f, h, w) -> (b, f * h/2 * w/2)."""
    return (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(mask.shape[0], -1)


class WanHooks(FamilyHooks):
    name = "wan"

    @staticmethod
    def _transformer_dtype(pipe):
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        return model.dtype

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        use_cfg = job.guidance_scale > 1.0
        prompt_embeds, negative_embeds = pipe.encode_prompt(
            prompt=job.prompt,
            negative_prompt=job.negative_prompt,
            do_classifier_free_guidance=use_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            device=device,
        )
        dtype = self._transformer_dtype(pipe)
        branches = {COND: {"encoder_hidden_states": prompt_embeds.to(dtype)}}
        if use_cfg:
            branches[UNCOND] = {"encoder_hidden_states": negative_embeds.to(dtype)}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch
        from diffusers import WanPipeline

        pipe.scheduler.set_timesteps(job.num_inference_steps, device=device)
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        latents = WanPipeline.prepare_latents(  # WanPipeline's own, also for a TI2V row without an image
            pipe, 1, model.config.in_channels, job.height, job.width, job.num_frames, torch.float32, device, generator)
        pipe.scheduler.set_begin_index(0)
        boundary = pipe.config.boundary_ratio
        shared = {"boundary_timestep": boundary * pipe.scheduler.config.num_train_timesteps if boundary else None}
        return Trajectory(latents=latents, timesteps=pipe.scheduler.timesteps, shared=shared)

    def denoiser_at(self, pipe, trajectory: Trajectory, t):
        """Wan 2.2 switches to `transformer_2` below the boundary timestep (guidance_scale_2 = guidance_scale)."""
        boundary = trajectory.shared["boundary_timestep"]
        if boundary is None or t >= boundary:
            return pipe.transformer
        return pipe.transformer_2

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        model = self.denoiser_at(pipe, trajectory, t)
        model_input = latents.to(self._transformer_dtype(pipe))
        if pipe.config.expand_timesteps:  # Wan 2.2 TI2V without an image: every token at t
            timestep = token_timesteps(torch.ones(latents.shape, dtype=torch.float32, device=latents.device), t)
        else:
            timestep = t.expand(latents.shape[0])
        return model(hidden_states=model_input, timestep=timestep, return_dict=False, **branch)[0]

    def combine(self, predictions, guidance_scale: float, t):
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents):
        import torch

        vae = pipe.vae
        latents = latents.to(device=next(vae.parameters()).device, dtype=vae.dtype)
        z_dim = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        return latents / inv_std + mean

    def postprocess(self, pipe, decoded):
        # (1, c, f, h, w) -> (f, h, w, c) in [0, 1]
        return pipe.video_processor.postprocess_video(decoded, output_type="np")[0]


def build_tiny(meta: frozenset[str] = frozenset()):
    """Wan 2.1 text-to-video (a CFG model): WanTransformer3DModel, AutoencoderKLWan, UMT5, UniPC flow scheduler."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = character_tokenizer(model_max_length=512)
    text_encoder = seeded(0, lambda: UMT5EncoderModel(UMT5Config(**t5_config(len(tokenizer)))), "text_encoder", meta)
    transformer = seeded(1, lambda: WanTransformer3DModel(**tiny_configs.TINY_WAN_TRANSFORMER), "transformer", meta)
    vae = seeded(2, lambda: AutoencoderKLWan(**tiny_configs.TINY_WAN_VAE))
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler, transformer=transformer)


TENSOR_SPLITS = TensorSplits(
    styles={
        # self- and cross-attention: q, k, v split by heads (attn2's k, v over the replicated text), the output
        # projection row-wise; the QK norm spans every head, so its mean square is all-reduced over tp
        **{f"blocks.*.{attn}.{proj}": COLWISE for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v")},
        **{f"blocks.*.{attn}.to_out.0": ROWWISE for attn in ("attn1", "attn2")},
        **{f"blocks.*.{attn}.{norm}": NORM_ACROSS_HEADS for attn in ("attn1", "attn2") for norm in ("norm_q", "norm_k")},
        "blocks.*.attn1": HEADS,
        "blocks.*.attn2": HEADS,
        "blocks.*.ffn.net.0.proj": COLWISE,
        "blocks.*.ffn.net.2": ROWWISE,
        # the AdaLN modulation, computed once per forward for every block: (B, 6d) gathered after the split
        "condition_embedder.time_proj": GATHERED_COLWISE,
    },
    all_reduces={"blocks": 3},  # self-attention, cross-attention and MLP outputs
)
"""Wan's tensor splits (diffusers has none): the cache-dit / SGLang layout, with the modulation sharded too."""

WAN21_1_3B_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024,
)
"""Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json."""
WAN21_14B_TRANSFORMER = {**WAN21_1_3B_TRANSFORMER, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
"""Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json."""
WAN21_VAE = dict(base_dim=96, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2, attn_scales=(),
                 temperal_downsample=(False, True, True), dropout=0.0, scale_factor_spatial=8, scale_factor_temporal=4)
"""Wan 2.1's vae/config.json (AutoencoderKLWan; its latents_mean / latents_std left out)."""
_UMT5_XXL = 5.68e9
"""UMT5-XXL's encoder, the text encoder of every Wan 2.1/2.2 model."""

FAMILY = ModelFamily(
    name="wan",
    pipelines=("WanPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=WanHooks(),
    transformers={
        "WanTransformer3DModel": TransformerParts(
            blocks=Blocks(before=("rope", "patch_embedding", "condition_embedder"), repeated=("blocks",),
                          after=("norm_out", "proj_out")),
            # self-attention `attn1` over the video tokens; `attn2` cross-attends to the replicated text
            attention=(AttentionSite(pattern="blocks.*.attn1", kind=SELF, streams=("hidden_states",)),
                       AttentionSite(pattern="blocks.*.attn2", kind=CROSS, streams=())),
            sequence=SequenceSplits(),  # diffusers' own _cp_plan
            tensor_splits=TENSOR_SPLITS,
            compile_units=("blocks.*",),  # diffusers' _repeated_blocks: WanTransformerBlock
            carried=("hidden_states",),
        ),
    },
    denoisers=("transformer", "transformer_2"),  # Wan 2.2: a second expert below the boundary timestep
    text_encoders={"UMT5EncoderModel": T5_ENCODER},
    text_encoder_splits={"UMT5EncoderModel": T5_TENSOR_SPLITS},
    vae_classes=("diffusers:AutoencoderKLWan",),
    vae_rules=vae_rules.AUTOENCODER_KL_WAN,
    presets=(TinyPreset(name="tiny-wan", transformer=tiny_configs.TINY_WAN_TRANSFORMER, vae=tiny_configs.TINY_WAN_VAE,
                        defaults=tiny_configs.PRESET_DEFAULTS["tiny-wan"], build=build_tiny),),
    vae_costs=vae_costs.WAN_VAE,
    published=(
        Published(name="wan2.1-1.3b", hub_id="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", transformer=WAN21_1_3B_TRANSFORMER,
                  vae=WAN21_VAE, parameters=1.42e9, text_encoder_parameters=_UMT5_XXL, vae_parameters=0.127e9),
        Published(name="wan2.1-14b", hub_id="Wan-AI/Wan2.1-T2V-14B-Diffusers", transformer=WAN21_14B_TRANSFORMER,
                  vae=WAN21_VAE, defaults={**CALL_DEFAULTS, "width": 1280, "height": 720}, parameters=14.29e9,
                  text_encoder_parameters=_UMT5_XXL, vae_parameters=0.127e9),
    ),
    # TeaCache's published coefficients (ali-vilab/TeaCache, TeaCache4Wan2.1/teacache_generate.py: its
    # retention-step set, fitted on the 6 x dim timestep projection diffusers' Wan blocks take as `temb`);
    # told apart by the config (Wan 2.1 I2V has an image projection, and no published set here)
    teacache=(
        TeaCacheModel(
            name="Wan 2.1 T2V 1.3B", transformer="WanTransformer3DModel",
            config=(("num_layers", 30), ("num_attention_heads", 12), ("attention_head_dim", 128), ("ffn_dim", 8960),
                    ("in_channels", 16), ("image_dim", None)),
            coefficients=(-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
            warmup_steps=5,
        ),
        TeaCacheModel(
            name="Wan 2.1 T2V 14B", transformer="WanTransformer3DModel",
            config=(("num_layers", 40), ("num_attention_heads", 40), ("attention_head_dim", 128),
                    ("ffn_dim", 13824), ("in_channels", 16), ("image_dim", None)),
            coefficients=(-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01),
            warmup_steps=5,
        ),
    ),
)
