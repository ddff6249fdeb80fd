"""FLUX.1 text-to-image, guidance-distilled (`diffusers.FluxPipeline`): everything genbatch knows about the
family. The denoise hooks reproduce `FluxPipeline.__call__` exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models import tiny_configs, vae_costs, vae_rules
from genbatch.models.base import (
    CLIP_TENSOR_SPLITS,
    CLIP_TEXT_ENCODER,
    GATHERED_COLWISE,
    HEADS,
    JOINT,
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
from genbatch.models.hooks import COND, Conditioning, FamilyHooks, Trajectory
from genbatch.models.shapes import Published
from genbatch.models.tiny import character_tokenizer, clip_config, seeded, t5_config

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline.__call__'s default

CALL_DEFAULTS = {"width": None, "height": None, "num_inference_steps": 28, "guidance_scale": 3.5}
"""FluxPipeline.__call__'s defaults (sizes: the transformer's default sample size times the VAE factor)."""

FLUX1_DEV_TRANSFORMER = dict(
    patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
"""black-forest-labs/FLUX.1-dev transformer/config.json."""
FLUX1_VAE = dict(
    in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=16, norm_num_groups=32,
    use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611, sample_size=1024,
)
"""black-forest-labs/FLUX.1-dev vae/config.json."""

SAMPLE_SIZE = 128
"""FluxPipeline's default_sample_size (latent pixels)."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    patch = (2, 2)  # the pipeline packs 2x2 latent pixels into one token
    if defaults is None:
        defaults = {**CALL_DEFAULTS, "width": SAMPLE_SIZE * spatial, "height": SAMPLE_SIZE * spatial}
    return transformer_spec(
        name, "flux", transformer, defaults=defaults, path=path, is_video=False, uses_cfg=False,
        size_multiple=spatial * patch[0], frame_multiple=1, vae_spatial=spatial, patch_size=patch,
        num_layers=transformer["num_layers"] + transformer["num_single_layers"], text_tokens=MAX_SEQUENCE_LENGTH,
        joint_text=True, tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer(
            {"transformer_blocks": transformer["num_layers"], "single_transformer_blocks": transformer["num_single_layers"]}),
    )


class FluxHooks(FamilyHooks):
    """FLUX.1 [dev]/[schnell]: one branch per step; the guidance scale is an input of the transformer."""

    name = "flux"
    per_row_shared = ("guidance",)
    shared_branch_keys = ("txt_ids",)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=job.prompt, prompt_2=None, device=device, num_images_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        branch = {"encoder_hidden_states": prompt_embeds, "pooled_projections": pooled, "txt_ids": text_ids}
        return Conditioning(branches={COND: branch}, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        channels, dtype = self.noise_format(pipe)
        latents, image_ids = pipe.prepare_latents(1, channels, job.height, job.width, dtype, device, generator)
        trajectory = self.schedule(pipe, job, latents, device)
        trajectory.shared["img_ids"] = image_ids
        return trajectory

    @staticmethod
    def noise_format(pipe) -> tuple[int, object]:
        """(latent channels before the 2x2 packing, dtype) of the noise, as the pipeline draws it."""
        dtype = pipe.text_encoder_2.dtype if pipe.text_encoder_2 is not None else pipe.transformer.dtype
        return pipe.transformer.config.in_channels // 4, dtype

    @staticmethod
    def schedule(pipe, job: JobSpec, latents, device) -> Trajectory:
        """The trajectory of the packed noise `latents`: the timesteps shifted by its token count, and the
        guidance input of a guidance-distilled transformer."""
        import numpy as np
        import torch
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        steps = job.num_inference_steps
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        config = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        guidance = None
        if pipe.transformer.config.guidance_embeds:
            guidance = torch.full([1], job.guidance_scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared={"guidance": guidance})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        return pipe.transformer(
            hidden_states=latents,
            timestep=timestep / 1000,
            guidance=trajectory.shared["guidance"],
            img_ids=trajectory.shared["img_ids"],
            joint_attention_kwargs={},
            return_dict=False,
            **branch,
        )[0]

    def combine(self, predictions, guidance_scale: float, t):
        return predictions[COND]

    def vae_input(self, pipe, job: JobSpec, latents):
        latents = pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor)
        latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        return latents.to(next(pipe.vae.parameters()).device)

    def postprocess(self, pipe, decoded):
        # (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]


def tiny_components(meta: frozenset[str] = frozenset()) -> dict:
    """The tiny FLUX.1 pipeline's components by name (FluxTransformer2DModel, AutoencoderKL, CLIP + T5, flow
    Euler), for any FLUX pipeline class; those named in `meta` on the meta device."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    clip_tokenizer = character_tokenizer(model_max_length=77)
    t5_tokenizer = character_tokenizer(model_max_length=512)
    clip = seeded(0, lambda: CLIPTextModel(clip_config(len(clip_tokenizer))), "text_encoder", meta)
    t5 = seeded(1, lambda: T5EncoderModel(T5Config(**t5_config(len(t5_tokenizer)))), "text_encoder_2", meta)
    transformer = seeded(2, lambda: FluxTransformer2DModel(**tiny_configs.TINY_FLUX_TRANSFORMER), "transformer", meta)
    vae = seeded(3, lambda: AutoencoderKL(**tiny_configs.TINY_FLUX_VAE))
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=4096,
        max_shift=1.15,
        use_dynamic_shifting=True,
        shift=3.0,
    )
    return dict(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=clip_tokenizer, text_encoder_2=t5,
                tokenizer_2=t5_tokenizer, transformer=transformer)


def build_tiny(meta: frozenset[str] = frozenset()):
    """FLUX.1 text-to-image, guidance-distilled: the tiny components in FluxPipeline."""
    from diffusers import FluxPipeline

    return FluxPipeline(**tiny_components(meta))


_JOINT = ("encoder_hidden_states", "hidden_states")  # the pipeline's order: [text, image]

TENSOR_SPLITS = TensorSplits(
    from_diffusers=True,  # its _tp_plan, plus the heads and the AdaLN modulation it keeps whole
    styles={"transformer_blocks.*.attn": HEADS, "single_transformer_blocks.*.attn": HEADS,
            "transformer_blocks.*.norm1.linear": GATHERED_COLWISE,
            "transformer_blocks.*.norm1_context.linear": GATHERED_COLWISE,
            "single_transformer_blocks.*.norm.linear": GATHERED_COLWISE,
            "norm_out.linear": GATHERED_COLWISE},
    # dual-stream: attention and MLP outputs of both streams; single-stream: one fused proj_out
    all_reduces={"transformer_blocks": 2, "single_transformer_blocks": 1},
)
"""FLUX's tensor splits: diffusers' `_tp_plan`, the modulation sharded too."""

FAMILY = ModelFamily(
    name="flux",
    pipelines=("FluxPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=FluxHooks(),
    transformers={
        "FluxTransformer2DModel": TransformerParts(
            blocks=Blocks(before=("pos_embed", "time_text_embed", "context_embedder", "x_embedder"),
                          repeated=("transformer_blocks", "single_transformer_blocks"),
                          after=("norm_out", "proj_out")),
            # joint attention over [text, image] in the double- and single-stream blocks; both streams split
            attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT, streams=_JOINT),
                       AttentionSite(pattern="single_transformer_blocks.*.attn", kind=JOINT, streams=_JOINT)),
            sequence=SequenceSplits(text_streams=("encoder_hidden_states", "txt_ids")),  # diffusers' own _cp_plan
            tensor_splits=TENSOR_SPLITS,
            # diffusers' _repeated_blocks: FluxTransformerBlock, FluxSingleTransformerBlock
            compile_units=("transformer_blocks.*", "single_transformer_blocks.*"),
            carried=("encoder_hidden_states", "hidden_states"),  # both block kinds return the two streams
        ),
    },
    text_encoders={"CLIPTextModel": CLIP_TEXT_ENCODER, "T5EncoderModel": T5_ENCODER},
    text_encoder_splits={"CLIPTextModel": CLIP_TENSOR_SPLITS, "T5EncoderModel": T5_TENSOR_SPLITS},
    vae_classes=("diffusers:AutoencoderKL",),
    vae_rules=vae_rules.AUTOENCODER_KL,
    presets=(TinyPreset(name="tiny-flux", transformer=tiny_configs.TINY_FLUX_TRANSFORMER,
                        vae=tiny_configs.TINY_FLUX_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-flux"],
                        build=build_tiny),),
    vae_costs=vae_costs.IMAGE_VAE,
    published=(
        Published(name="flux.1-dev", hub_id="black-forest-labs/FLUX.1-dev", transformer=FLUX1_DEV_TRANSFORMER,
                  vae=FLUX1_VAE, parameters=11.9e9,
                  text_encoder_parameters=4.88e9,  # T5-XXL encoder 4.76B + CLIP-L 0.12B
                  vae_parameters=0.084e9),
    ),
    # TeaCache's published coefficients (ali-vilab/TeaCache, TeaCache4FLUX/teacache_flux.py, fitted on block 0's
    # `norm1` output); FLUX.1-schnell (no guidance embedding) has none
    teacache=(
        TeaCacheModel(
            name="FLUX.1-dev", transformer="FluxTransformer2DModel",
            config=(("num_layers", 19), ("num_single_layers", 38), ("num_attention_heads", 24),
                    ("attention_head_dim", 128), ("in_channels", 64), ("guidance_embeds", True)),
            coefficients=(4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01),
            warmup_steps=1,
        ),
    ),
)
