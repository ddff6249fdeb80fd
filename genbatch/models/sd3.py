"""Stable Diffusion 3 / 3.5 text-to-image (`diffusers.StableDiffusion3Pipeline`): everything genbatch knows
about the family.

The pipeline batches the two guidance branches into one forward of batch 2; genbatch runs them as two
forwards so that CFG parallelism can put them on different ranks. The result equals the pipeline's within
float rounding (a batch-2 matmul is not always bit-identical to two batch-1 matmuls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models import tiny_configs, vae_costs, vae_rules
from genbatch.models.base import (
    CLIP_TEXT_ENCODER_WITH_PROJECTION,
    CLIP_WITH_PROJECTION_TENSOR_SPLITS,
    COLWISE,
    GATHERED_COLWISE,
    HEADS,
    JOINT,
    SELF,
    T5_ENCODER,
    T5_TENSOR_SPLITS,
    AttentionSite,
    Blocks,
    Gather,
    ModelFamily,
    ROWWISE,
    SequenceSplits,
    Split,
    TensorSplits,
    TinyPreset,
    TransformerParts,
    dual_stream_styles,
    transformer_spec,
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, Trajectory, classifier_free_guidance
from genbatch.models.shapes import Published
from genbatch.models.tiny import character_tokenizer, clip_config, seeded, t5_config

MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline.__call__'s default
CLIP_TOKENS = 77
SD3_MEDIUM_TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                              num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                              pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192)
"""stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json."""
SD3_VAE = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
               latent_channels=16, shift_factor=0.0609, scaling_factor=1.5305, use_quant_conv=False,
               use_post_quant_conv=False)
"""Its vae/config.json (AutoencoderKL)."""

CALL_DEFAULTS = {"width": None, "height": None, "num_inference_steps": 28, "guidance_scale": 7.0}
"""StableDiffusion3Pipeline.__call__'s defaults (sizes: the transformer's sample size times the VAE factor)."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    patch = (transformer["patch_size"],) * 2
    if defaults is None:
        sample = transformer["sample_size"]
        defaults = {**CALL_DEFAULTS, "width": sample * spatial, "height": sample * spatial}
    return transformer_spec(
        name, "sd3", transformer, defaults=defaults, path=path, is_video=False, uses_cfg=True,
        size_multiple=spatial * patch[0], frame_multiple=1, vae_spatial=spatial, patch_size=patch,
        num_layers=transformer["num_layers"], text_tokens=CLIP_TOKENS + MAX_SEQUENCE_LENGTH,  # CLIP's, then T5's
        joint_text=True,
    )


class SD3Hooks(FamilyHooks):
    name = "sd3"

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        use_cfg = job.guidance_scale > 1.0
        embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
            prompt=job.prompt, prompt_2=None, prompt_3=None, device=device, num_images_per_prompt=1,
            do_classifier_free_guidance=use_cfg, negative_prompt=job.negative_prompt,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        branches = {COND: {"encoder_hidden_states": embeds, "pooled_projections": pooled}}
        if use_cfg:
            branches[UNCOND] = {"encoder_hidden_states": negative_embeds, "pooled_projections": negative_pooled}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
            retrieve_timesteps,
        )

        transformer = pipe.transformer
        dtype = pipe.text_encoder.dtype if pipe.text_encoder is not None else transformer.dtype
        latents = pipe.prepare_latents(1, transformer.config.in_channels, job.height, job.width, dtype, device,
                                       generator)
        config = pipe.scheduler.config
        extra = {}
        if config.get("use_dynamic_shifting", None):
            patch = transformer.config.patch_size
            sequence = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            extra["mu"] = calculate_shift(sequence, config.get("base_image_seq_len", 256),
                                          config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                                          config.get("max_shift", 1.16))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, job.num_inference_steps, device, **extra)
        return Trajectory(latents=latents, timesteps=timesteps)

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        return pipe.transformer(hidden_states=latents, timestep=t.expand(latents.shape[0]),
                                joint_attention_kwargs=None, return_dict=False, **branch)[0]

    def combine(self, predictions, guidance_scale: float, t):
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents):
        return latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor

    def postprocess(self, pipe, decoded):
        # (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]


def build_tiny(meta: frozenset[str] = frozenset()):
    """Stable Diffusion 3 (a CFG model): SD3Transformer2DModel (joint attention), two CLIPs + T5, flow Euler."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5Config, T5EncoderModel

    tokenizers = [character_tokenizer(model_max_length=77) for _ in range(2)]
    t5_tokenizer = character_tokenizer(model_max_length=256)
    encoders = [
        seeded(10 + index, lambda: CLIPTextModelWithProjection(clip_config(len(tokenizer))), name, meta)
        for index, (name, tokenizer) in enumerate(zip(("text_encoder", "text_encoder_2"), tokenizers))
    ]
    t5 = seeded(12, lambda: T5EncoderModel(T5Config(**t5_config(len(t5_tokenizer)))), "text_encoder_3", meta)
    transformer = seeded(13, lambda: SD3Transformer2DModel(**tiny_configs.TINY_SD3_TRANSFORMER), "transformer", meta)
    vae = seeded(14, lambda: AutoencoderKL(**tiny_configs.TINY_SD3_VAE))
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=encoders[0],
        tokenizer=tokenizers[0],
        text_encoder_2=encoders[1],
        tokenizer_2=tokenizers[1],
        text_encoder_3=t5,
        tokenizer_3=t5_tokenizer,
        transformer=transformer,
    )


_IMAGE, _TEXT = "pos_embed:0", "context_embedder:0"  # image tokens split after patch embedding, text after projection

FAMILY = ModelFamily(
    name="sd3",
    pipelines=("StableDiffusion3Pipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=SD3Hooks(),
    transformers={
        "SD3Transformer2DModel": TransformerParts(
            blocks=Blocks(before=("pos_embed", "time_text_embed", "context_embedder"), repeated=("transformer_blocks",),
                          after=("norm_out", "proj_out")),
            # joint attention over both streams, and SD3.5's extra self-attention `attn2` over the image alone
            attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT, streams=(_IMAGE, _TEXT)),
                       AttentionSite(pattern="transformer_blocks.*.attn2", kind=SELF, streams=(_IMAGE,))),
            # diffusers has no split points for SD3: the streams split where they are made, the image gathered at the end
            sequence=SequenceSplits(
                points={"pos_embed": {0: Split(dim=1, expected_dims=3, output=True)},
                        "context_embedder": {0: Split(dim=1, expected_dims=3, output=True)},
                        "proj_out": Gather(dim=1, expected_dims=3)},
                output_stream=_IMAGE,
                text_streams=(_TEXT,),
            ),
            # genbatch's own (diffusers has no _tp_plan for SD3): the dual-stream blocks, SD3.5's image-only
            # `attn2`, and the final modulation; the last block's text projection and MLP do not exist
            tensor_splits=TensorSplits(
                styles={**dual_stream_styles("transformer_blocks"),
                        **{f"transformer_blocks.*.attn2.{name}": COLWISE for name in ("to_q", "to_k", "to_v")},
                        "transformer_blocks.*.attn2.to_out.0": ROWWISE, "transformer_blocks.*.attn2": HEADS,
                        "norm_out.linear": GATHERED_COLWISE},
                all_reduces={"transformer_blocks": 2},
                text_free_last_block=True,
            ),
            # genbatch's own: diffusers declares no _repeated_blocks for SD3 (the last block, context_pre_only,
            # and SD3.5's dual-attention blocks are the same class and compile as their own graphs)
            compile_units=("transformer_blocks.*",),
            carried=("encoder_hidden_states", "hidden_states"),
        ),
    },
    text_encoders={"CLIPTextModelWithProjection": CLIP_TEXT_ENCODER_WITH_PROJECTION, "T5EncoderModel": T5_ENCODER},
    text_encoder_splits={"CLIPTextModelWithProjection": CLIP_WITH_PROJECTION_TENSOR_SPLITS,
                        "T5EncoderModel": T5_TENSOR_SPLITS},
    vae_classes=("diffusers:AutoencoderKL",),
    vae_rules=vae_rules.AUTOENCODER_KL,
    presets=(TinyPreset(name="tiny-sd3", transformer=tiny_configs.TINY_SD3_TRANSFORMER, vae=tiny_configs.TINY_SD3_VAE,
                        defaults=tiny_configs.PRESET_DEFAULTS["tiny-sd3"], build=build_tiny),),
    vae_costs=vae_costs.IMAGE_VAE,
    published=(
        Published(name="sd3-medium", hub_id="stabilityai/stable-diffusion-3-medium-diffusers",
                  transformer=SD3_MEDIUM_TRANSFORMER, vae=SD3_VAE, parameters=2.03e9,
                  text_encoder_parameters=5.58e9,  # T5-XXL encoder 4.76B, CLIP-L 0.12B, OpenCLIP-bigG 0.69B
                  vae_parameters=0.084e9),
    ),
)
