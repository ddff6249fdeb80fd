"""HunyuanVideo text-to-video (`diffusers.HunyuanVideoPipeline`): everything genbatch knows about the family.

`HunyuanVideoTransformer3DModel` runs dual-stream blocks, then single-stream blocks, each with one joint
attention over [video, text] tokens. It is guidance-distilled: one forward a step, the manifest's
`guidance_scale` an input of the transformer (the pipeline's `guidance_scale`, its "embedded guidance"). The
pipeline's true CFG is off by default (`true_cfg_scale=1`), so a row's `negative_prompt` is ignored, as the
pipeline ignores it, and the family takes no cfg axis.

The text is a Llama model's hidden states (the prompt in a chat template, padded to 256 tokens after the
template is cropped) plus a pooled CLIP embedding. The padded text tokens stay in the sequence: every block
gets a key-padding mask built by the transformer from the text's attention mask.

The denoise hooks reproduce `HunyuanVideoPipeline.__call__` exactly. The VAE (`AutoencoderKLHunyuanVideo`) has
no patch-parallel decode: a job group's leader decodes alone, whole or tiled (`gen run --vae-decode`,
`genbatch.runner.decode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models.base import (
    CLIP_TENSOR_SPLITS,
    CLIP_TEXT_ENCODER,
    GATHERED_COLWISE,
    JOINT,
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
    single_stream_styles,
)
from genbatch.models.hooks import COND, Conditioning, FamilyHooks, Trajectory
from genbatch.models.shapes import Published
from genbatch.models import vae_costs

MAX_SEQUENCE_LENGTH = 256  # HunyuanVideoPipeline.__call__'s default: the text is padded to this length
PUBLISHED_TRANSFORMER = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                             num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2,
                             patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                             pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=(16, 56, 56))
"""hunyuanvideo-community/HunyuanVideo transformer/config.json."""
PUBLISHED_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
                     layers_per_block=2, spatial_compression_ratio=8, temporal_compression_ratio=4,
                     scaling_factor=0.476986)
"""Its vae/config.json (AutoencoderKLHunyuanVideo)."""

CALL_DEFAULTS = {"width": 1280, "height": 720, "num_frames": 129, "num_inference_steps": 50, "guidance_scale": 6.0,
                 "fps": 15}
"""HunyuanVideoPipeline.__call__'s defaults (fps: the pipeline's example export)."""

TINY_TRANSFORMER = dict(in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=1,
                        num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
                        text_embed_dim=32, pooled_projection_dim=32, rope_axes_dim=(2, 2, 4))
TINY_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, down_block_types=["HunyuanVideoDownBlock3D"] * 4,
                up_block_types=["HunyuanVideoUpBlock3D"] * 4, block_out_channels=[8, 8, 8, 8], layers_per_block=1,
                act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
                temporal_compression_ratio=4, mid_block_add_attention=True)
TINY_DEFAULTS = {"width": 64, "height": 48, "num_frames": 9, "num_inference_steps": 6, "guidance_scale": 6.0,
                 "fps": 8}
TINY_LLAMA = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, pad_token_id=0, bos_token_id=None, eos_token_id=1)
"""A three-layer Llama: the pipeline takes the hidden states two layers below the last, here the first's output."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = vae.get("spatial_compression_ratio", 8)
    patch = (transformer["patch_size_t"], transformer["patch_size"], transformer["patch_size"])
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    hidden = heads * head_dim
    return ModelSpec(
        name=name,
        family="hunyuan-video",
        is_video=True,
        uses_cfg=False,
        size_multiple=spatial * patch[1],  # the pipeline refuses sizes that are not multiples of 16
        frame_multiple=vae.get("temporal_compression_ratio", 4),
        vae_spatial=spatial,
        patch_size=patch,
        num_layers=transformer["num_layers"] + transformer["num_single_layers"],
        num_heads=heads,
        head_dim=head_dim,
        text_tokens=MAX_SEQUENCE_LENGTH,
        joint_text=True,
        ffn_dim=int(hidden * transformer.get("mlp_ratio", 4.0)),
        out_channels=int(transformer.get("out_channels") or 16),
        defaults=dict(defaults or CALL_DEFAULTS),
        path=path,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer(
            {"transformer_blocks": transformer["num_layers"], "single_transformer_blocks": transformer["num_single_layers"]}),
    )


class HunyuanVideoHooks(FamilyHooks):
    name = "hunyuan-video"
    per_row_shared = ("guidance",)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

        embeds, pooled, mask = pipe.encode_prompt(prompt=job.prompt, prompt_2=None,
                                                  prompt_template=DEFAULT_PROMPT_TEMPLATE, num_videos_per_prompt=1,
                                                  device=device, max_sequence_length=MAX_SEQUENCE_LENGTH)
        dtype = pipe.transformer.dtype
        branch = {"encoder_hidden_states": embeds.to(dtype), "encoder_attention_mask": mask.to(dtype),
                  "pooled_projections": pooled.to(dtype)}
        return Conditioning(branches={COND: branch}, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import numpy as np
        import torch
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import retrieve_timesteps

        steps = job.num_inference_steps
        sigmas = np.linspace(1.0, 0.0, steps + 1)[:-1]
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas)
        latents = pipe.prepare_latents(1, pipe.transformer.config.in_channels, job.height, job.width, job.num_frames,
                                       torch.float32, device, generator)
        # the embedded guidance, an input of every forward
        guidance = torch.tensor([job.guidance_scale] * latents.shape[0], dtype=pipe.transformer.dtype,
                                device=device) * 1000.0
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared={"guidance": guidance})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        return pipe.transformer(hidden_states=latents.to(pipe.transformer.dtype), timestep=timestep,
                                guidance=trajectory.shared["guidance"], attention_kwargs=None, return_dict=False,
                                **branch)[0]

    def combine(self, predictions, guidance_scale: float, t):
        return predictions[COND]

    def vae_input(self, pipe, job: JobSpec, latents):
        vae = pipe.vae
        return latents.to(device=next(vae.parameters()).device, dtype=vae.dtype) / vae.config.scaling_factor

    def postprocess(self, pipe, decoded):
        # (1, c, f, h, w) -> (f, h, w, c) in [0, 1]
        return pipe.video_processor.postprocess_video(decoded, output_type="np")[0]


def build_tiny(meta: frozenset[str] = frozenset()):
    """HunyuanVideo (embedded guidance, no CFG): HunyuanVideoTransformer3DModel, AutoencoderKLHunyuanVideo, a
    three-layer Llama and a two-layer CLIP text encoder, flow-match Euler with HunyuanVideo's shift of 7."""
    import torch
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from transformers import CLIPTextModel, LlamaConfig, LlamaModel

    from genbatch.models.prompt_tokenizer import template_tokenizer
    from genbatch.models.tiny import character_tokenizer, clip_config, placed

    crop = DEFAULT_PROMPT_TEMPLATE["crop_start"]
    tokenizer = template_tokenizer(DEFAULT_PROMPT_TEMPLATE["template"], crop, MAX_SEQUENCE_LENGTH + crop)
    clip_tokenizer = character_tokenizer(model_max_length=77)
    torch.manual_seed(0)
    with placed("text_encoder", meta):
        llama = LlamaModel(LlamaConfig(vocab_size=len(tokenizer), **TINY_LLAMA)).eval()
    torch.manual_seed(1)
    with placed("text_encoder_2", meta):
        clip = CLIPTextModel(clip_config(len(clip_tokenizer))).eval()
    torch.manual_seed(2)
    with placed("transformer", meta):
        transformer = HunyuanVideoTransformer3DModel(**TINY_TRANSFORMER).eval()
    torch.manual_seed(3)
    vae = AutoencoderKLHunyuanVideo(**TINY_VAE).eval()
    return HunyuanVideoPipeline(text_encoder=llama, tokenizer=tokenizer, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip,
                                tokenizer_2=clip_tokenizer)


TENSOR_SPLITS = TensorSplits(
    styles={**dual_stream_styles("transformer_blocks"), **single_stream_styles("single_transformer_blocks"),
            "norm_out.linear": GATHERED_COLWISE},
    all_reduces={"transformer_blocks": 2, "single_transformer_blocks": 1},
)
"""HunyuanVideo's tensor splits (diffusers has none): dual- and single-stream blocks and the final modulation;
the token refiner runs once on the text, whole on every rank."""

FAMILY = ModelFamily(
    name="hunyuan-video",
    pipelines=("HunyuanVideoPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=HunyuanVideoHooks(),
    transformers={
        "HunyuanVideoTransformer3DModel": TransformerParts(
            blocks=Blocks(before=("rope", "time_text_embed", "x_embedder", "context_embedder"),
                          repeated=("transformer_blocks", "single_transformer_blocks"),
                          after=("norm_out", "proj_out")),
            # joint attention over [video, text] in the dual- and single-stream blocks, with the text's
            # key-padding mask; the token refiner's self-attention (inside `context_embedder`) runs on the
            # whole text before any split
            attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT,
                                     streams=("hidden_states", "encoder_hidden_states"), masked=True),
                       AttentionSite(pattern="single_transformer_blocks.*.attn", kind=JOINT,
                                     streams=("hidden_states", "encoder_hidden_states"), masked=True)),
            # diffusers has no split points for it: both streams split at the first dual-stream block, after the
            # transformer has built its [video, text] key-padding mask over the whole sequence (the full form
            # of the masks), and the video rotary tables with them
            sequence=SequenceSplits(points={
                "transformer_blocks.0": {"hidden_states": Split(dim=1, expected_dims=3),
                                         "encoder_hidden_states": Split(dim=1, expected_dims=3)},
                "rope": {0: Split(dim=0, expected_dims=2, output=True), 1: Split(dim=0, expected_dims=2, output=True)},
                "proj_out": Gather(dim=1, expected_dims=3),
            }),
            # genbatch's own (diffusers has no _tp_plan for it): the dual- and single-stream blocks and the
            # final modulation; the token refiner runs once on the text, whole on every rank
            tensor_splits=TENSOR_SPLITS,
            # diffusers' _repeated_blocks: the dual- and single-stream blocks (the token refiner's run once)
            compile_units=("transformer_blocks.*", "single_transformer_blocks.*"),
        ),
    },
    text_encoders={
        "LlamaModel": Blocks(before=("embed_tokens",), repeated=("layers",), after=("norm",)),
        "CLIPTextModel": CLIP_TEXT_ENCODER,
    },
    text_encoder_splits={"LlamaModel": decoder_tensor_splits("layers"), "CLIPTextModel": CLIP_TENSOR_SPLITS},
    presets=(TinyPreset(name="tiny-hunyuan-video", transformer=TINY_TRANSFORMER, vae=TINY_VAE,
                        defaults=TINY_DEFAULTS, build=build_tiny),),
    vae_costs=vae_costs.HUNYUAN_VIDEO_VAE,
    published=(
        Published(name="hunyuanvideo", hub_id="hunyuanvideo-community/HunyuanVideo",
                  transformer=PUBLISHED_TRANSFORMER, vae=PUBLISHED_VAE, parameters=12.8e9,
                  text_encoder_parameters=7.62e9,  # Llava-Llama-3-8B text model 7.5B + CLIP-L 0.12B
                  vae_parameters=0.246e9),
    ),
)
