"""Qwen-Image text-to-image (`diffusers.QwenImagePipeline`): everything genbatch knows about the family.

A dual-stream MMDiT (`QwenImageTransformer2DModel`): text and image tokens keep their own weights and meet in
one joint attention per block, text first. Its guidance is "true CFG": a second forward on the negative prompt,
combined as `uncond + scale * (cond - uncond)` and rescaled to the conditional prediction's norm per token.
The denoise hooks reproduce `QwenImagePipeline.__call__` exactly; the manifest's `guidance_scale` is the
pipeline's `true_cfg_scale`.

The pipeline turns true CFG on only when `true_cfg_scale > 1` and a negative prompt is given, and so does
genbatch: a row without `negative_prompt` runs one branch (the conditional one), as the pipeline runs it. Under
a cfg 2 layout such a row runs that single branch on both cfg halves, exactly as every CFG family runs a row
with `guidance_scale <= 1` (`genbatch.parallel.cfg`): each rank does one forward a step, the same one, there is
no prediction exchange, and the output equals one process's. A row with a negative prompt puts the
conditional branch on one half and the unconditional on the other.

For one prompt the text encoder's output has no padding (the pipeline pads only to the longest prompt of a
batch and drops the mask when nothing is padded), so the transformer sees no text mask. A batch of rows
(`--batch-size`) pads each row's encode with zeros to its longest and masks the padding, as the pipeline does
for a list of prompts (`QwenImageHooks.batch_conditioning`).

The VAE (`AutoencoderKLQwenImage`, Wan 2.1's under other class names) decodes and encodes patch-parallel over
the job group with Wan's rules (`vae_rules.AUTOENCODER_KL_QWEN_IMAGE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch.models.base import (
    GATHERED_COLWISE,
    HEADS,
    JOINT,
    AttentionSite,
    Blocks,
    ModelFamily,
    SequenceSplits,
    TensorSplits,
    TinyPreset,
    TransformerParts,
    decoder_tensor_splits,
    mlp_and_out_channels,
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, TokenGrid, Trajectory
from genbatch.models.shapes import Published
from genbatch.models import vae_costs, vae_rules
from genbatch.models.wan import WanHooks

MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline.__call__'s default
TEXT_TOKENS = 256
PUBLISHED_TRANSFORMER = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                             num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                             axes_dims_rope=(16, 56, 56))
"""Qwen/Qwen-Image transformer/config.json."""
PUBLISHED_VAE = dict(base_dim=96, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2, attn_scales=(),
                     temperal_downsample=(False, True, True), dropout=0.0)
"""Qwen/Qwen-Image vae/config.json (AutoencoderKLQwenImage; its latents_mean / latents_std left out)."""
"""Text tokens the planner counts per prompt: the pipeline does not pad one prompt and cuts at 512."""
SAMPLE_SIZE = 128
"""QwenImagePipeline's default_sample_size (latent pixels)."""

CALL_DEFAULTS = {"width": None, "height": None, "num_inference_steps": 50, "guidance_scale": 4.0}
"""QwenImagePipeline.__call__'s defaults (guidance_scale: its `true_cfg_scale`; sizes: the default sample size
times the VAE factor)."""

TINY_TRANSFORMER = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                        num_attention_heads=4, joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(8, 4, 4))
TINY_VAE = dict(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
                latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
TINY_DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 6, "guidance_scale": 4.0}
TINY_TEXT_ENCODER = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, rope_theta=1000000.0,
                         rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"})
"""A two-layer Qwen2.5-VL language model (its rotary sections add up to half its head size, 8)."""
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32)


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = 2 ** len(vae["temperal_downsample"])  # QwenImagePipeline.vae_scale_factor
    patch = (transformer["patch_size"],) * 2  # the pipeline packs 2x2 latent pixels into one token
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    ffn, out_channels = mlp_and_out_channels(transformer, heads * head_dim)
    if defaults is None:
        defaults = {**CALL_DEFAULTS, "width": SAMPLE_SIZE * spatial, "height": SAMPLE_SIZE * spatial}
    return ModelSpec(
        name=name,
        family="qwen-image",
        is_video=False,
        uses_cfg=True,
        cfg_needs_negative_prompt=True,
        size_multiple=spatial * patch[0],
        frame_multiple=1,
        vae_spatial=spatial,
        patch_size=patch,
        num_layers=transformer["num_layers"],
        num_heads=heads,
        head_dim=head_dim,
        text_tokens=TEXT_TOKENS,
        joint_text=True,
        ffn_dim=ffn,
        out_channels=out_channels,
        defaults=dict(defaults),
        path=path,
    )


def true_cfg(predictions, guidance_scale: float):
    """QwenImagePipeline's true CFG: `uncond + scale * (cond - uncond)`, rescaled per token to the norm of the
    conditional prediction; the conditional prediction alone when the job runs one branch."""
    import torch

    cond = predictions[COND]
    if UNCOND not in predictions:
        return cond
    uncond = predictions[UNCOND]
    combined = uncond + guidance_scale * (cond - uncond)
    return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))


class QwenImageHooks(FamilyHooks):
    name = "qwen-image"
    per_row_shared = ("img_shapes",)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        use_cfg = job.guidance_scale > 1.0 and job.negative_prompt is not None
        texts = {COND: job.prompt, **({UNCOND: job.negative_prompt} if use_cfg else {})}
        branches = {}
        for branch, text in texts.items():
            embeds, mask = pipe.encode_prompt(prompt=text, device=device, num_images_per_prompt=1,
                                              max_sequence_length=MAX_SEQUENCE_LENGTH)
            branches[branch] = {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def batch_conditioning(self, rows: list[Conditioning]) -> Conditioning:
        """Each row's text (1, n_i, d) padded with zeros to the longest n and masked there (the pipeline's
        `_get_qwen_prompt_embeds` for a list of prompts); no mask when no row is padded."""
        import torch

        padded = [Conditioning(branches={name: dict(kwargs) for name, kwargs in row.branches.items()},
                               guidance_scale=row.guidance_scale) for row in rows]
        for name in rows[0].branches:
            texts = [row.branches[name] for row in padded]
            longest = max(text["encoder_hidden_states"].shape[1] for text in texts)
            if all(text["encoder_hidden_states"].shape[1] == longest and text["encoder_hidden_states_mask"] is None
                   for text in texts):
                continue  # nothing padded: no mask, as the pipeline drops it
            for text in texts:
                embeds, mask = text["encoder_hidden_states"], text["encoder_hidden_states_mask"]
                if mask is None:
                    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
                missing = longest - embeds.shape[1]
                # (1, n, d) -> (1, longest, d) and its mask (1, n) -> (1, longest): zeros after n
                text["encoder_hidden_states"] = torch.cat([embeds, embeds.new_zeros(1, missing, embeds.shape[2])], 1)
                text["encoder_hidden_states_mask"] = torch.cat([mask, mask.new_zeros(1, missing)], dim=1)
        return super().batch_conditioning(padded)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        self.check_guidance(pipe, job)
        channels = pipe.transformer.config.in_channels // 4
        # the noise in the prompt embeddings' dtype, which is the text encoder's
        latents = pipe.prepare_latents(1, channels, job.height, job.width, pipe.text_encoder.dtype, device, generator)
        factor = pipe.vae_scale_factor
        return self.schedule(pipe, job, latents, [[(1, job.height // factor // 2, job.width // factor // 2)]], device)

    @staticmethod
    def check_guidance(pipe, job: JobSpec) -> None:
        if pipe.transformer.config.guidance_embeds:
            raise ValueError(f"model {job.model} is a guidance-distilled Qwen-Image (guidance_embeds=True), which "
                             "takes a guidance scale as an input besides true CFG; genbatch runs Qwen-Image models "
                             "with guidance_embeds=False")

    @staticmethod
    def schedule(pipe, job: JobSpec, latents, img_shapes, device) -> Trajectory:
        """The trajectory of the packed noise `latents` (1, n, c): the pipeline's timesteps, shifted by its
        token count n; `img_shapes` is the transformer's grids of the image stream."""
        import numpy as np
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

        steps = job.num_inference_steps
        config = pipe.scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                             config.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 1 / steps, steps),
                                          mu=mu)
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared={"img_shapes": img_shapes})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        return pipe.transformer(hidden_states=latents, timestep=timestep / 1000, guidance=None,
                                img_shapes=trajectory.shared["img_shapes"], attention_kwargs={}, return_dict=False,
                                **branch)[0]

    def conditioning_grids(self, pipe, trajectory: Trajectory) -> tuple[TokenGrid, ...]:
        """The grids after the noise's in `img_shapes` (Qwen-Image-Edit's input image; none for text-to-image):
        (frames, rows, row tokens) each, the same for every row of a batch."""
        return tuple(TokenGrid(tokens=frames * rows * columns, row_tokens=columns)
                     for frames, rows, columns in trajectory.shared["img_shapes"][0][1:])

    def combine(self, predictions, guidance_scale: float, t):
        return true_cfg(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents):
        # (1, h/2 * w/2, c * 4) -> (1, c, 1, h, w): one frame for the video-shaped VAE
        latents = pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor)
        # the VAE is Wan 2.1's, its latents denormalised by its per-channel mean and std as Wan's are
        return WanHooks().vae_input(pipe, job, latents)

    def postprocess(self, pipe, decoded):
        # (1, c, 1, h, w) -> its one frame (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded[:, :, 0], output_type="np")[0]


def tiny_components(tokenizer, meta: frozenset[str], vision_ids: Mapping[str, int] | None = None) -> dict:
    """The tiny Qwen-Image components but the tokenizer's: QwenImageTransformer2DModel, AutoencoderKLQwenImage, a
    two-layer Qwen2.5-VL (its vocabulary `tokenizer`'s, with a one-block vision tower) and flow-match Euler with
    Qwen-Image's published exponential shift. `vision_ids`: the vision tokens' ids (`image_token_id`,
    `vision_start_token_id`, `vision_end_token_id`) in `tokenizer`; None: past its vocabulary, so that a text
    prompt never holds them."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from genbatch.models.tiny import placed

    vocab = len(tokenizer)
    special = dict(pad_token_id=0, bos_token_id=None, eos_token_id=1)
    ids = {**dict(image_token_id=vocab, video_token_id=vocab + 1, vision_start_token_id=vocab + 2,
                  vision_end_token_id=vocab + 3, vision_token_id=vocab + 4), **(vision_ids or {})}
    config = Qwen2_5_VLConfig(text_config={**TINY_TEXT_ENCODER, "vocab_size": vocab, **special},
                              vision_config=TINY_VISION, vocab_size=vocab, **ids, **special)
    torch.manual_seed(0)
    with placed("text_encoder", meta):
        text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    torch.manual_seed(1)
    with placed("transformer", meta):
        transformer = QwenImageTransformer2DModel(**TINY_TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = AutoencoderKLQwenImage(**TINY_VAE).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192,
                                                max_shift=0.9, shift=1.0, shift_terminal=0.02,
                                                use_dynamic_shifting=True, time_shift_type="exponential")
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def build_tiny(meta: frozenset[str] = frozenset()):
    """Qwen-Image (true CFG): the tiny components (`tiny_components`) with a tokenizer of the prompt template."""
    from diffusers import QwenImagePipeline

    from genbatch.models.prompt_tokenizer import template_tokenizer

    probe = QwenImagePipeline(None, None, None, None, None)  # the prompt template and its crop, as the pipeline
    crop = probe.prompt_template_encode_start_idx
    tokenizer = template_tokenizer(probe.prompt_template_encode, crop, probe.tokenizer_max_length + crop)
    return QwenImagePipeline(**tiny_components(tokenizer, meta))


VL_ENCODER_BLOCKS = Blocks(
    before=("model.language_model.embed_tokens",),
    repeated=("model.visual.blocks", "model.language_model.layers"),  # the vision tower idles on text
    after=("model.language_model.norm", "lm_head"),
)
"""The blocks of a Qwen vision-language text encoder (Qwen2.5-VL here, Qwen3-VL for Qwen-Image 2.1: the same
module names)."""
VL_ENCODER_SPLITS = decoder_tensor_splits("model.language_model.layers")
"""Its tensor splits: the decoder layers' heads and MLP."""


FAMILY = ModelFamily(
    name="qwen-image",
    pipelines=("QwenImagePipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=QwenImageHooks(),
    transformers={
        "QwenImageTransformer2DModel": TransformerParts(
            blocks=Blocks(before=("img_in", "txt_norm", "txt_in", "time_text_embed", "pos_embed"),
                          repeated=("transformer_blocks",), after=("norm_out", "proj_out")),
            # joint attention over [text, image] in every dual-stream block
            attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT,
                                     streams=("encoder_hidden_states", "hidden_states"), masked=True),),
            # diffusers' own _cp_plan: both streams, the text mask and the rotary tables split at the first
            # block; the processor builds the key-padding mask from the split text mask. A PipeFusion patch keeps
            # the text, its mask and its rotary table (`pos_embed`'s second output) whole
            sequence=SequenceSplits(text_streams=("encoder_hidden_states", "encoder_hidden_states_mask",
                                                  "pos_embed:1")),
            tensor_splits=TensorSplits(
                from_diffusers=True,  # its _tp_plan, plus the heads and the AdaLN modulation it keeps whole
                styles={"transformer_blocks.*.attn": HEADS, "transformer_blocks.*.img_mod.1": GATHERED_COLWISE,
                        "transformer_blocks.*.txt_mod.1": GATHERED_COLWISE, "norm_out.linear": GATHERED_COLWISE},
                all_reduces={"transformer_blocks": 2},  # attention and MLP outputs of both streams
            ),
            compile_units=("transformer_blocks.*",),  # diffusers' _repeated_blocks: QwenImageTransformerBlock
            carried=("encoder_hidden_states", "hidden_states"),  # a block returns the two streams
        ),
    },
    text_encoders={"Qwen2_5_VLForConditionalGeneration": VL_ENCODER_BLOCKS},
    text_encoder_splits={"Qwen2_5_VLForConditionalGeneration": VL_ENCODER_SPLITS},
    vae_classes=("diffusers:AutoencoderKLQwenImage",),
    vae_rules=vae_rules.AUTOENCODER_KL_QWEN_IMAGE,
    presets=(TinyPreset(name="tiny-qwen-image", transformer=TINY_TRANSFORMER, vae=TINY_VAE, defaults=TINY_DEFAULTS,
                        build=build_tiny),),
    vae_costs=vae_costs.QWEN_IMAGE_VAE,
    published=(
        Published(name="qwen-image", hub_id="Qwen/Qwen-Image", transformer=PUBLISHED_TRANSFORMER, vae=PUBLISHED_VAE,
                  parameters=20.4e9, text_encoder_parameters=8.29e9,  # Qwen2.5-VL-7B
                  vae_parameters=0.127e9),
    ),
)
