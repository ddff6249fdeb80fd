"""FLUX.2 [dev] (`diffusers.Flux2Pipeline`): everything genbatch knows about the family, and the hooks and parts
FLUX.2 [klein] (`genbatch.models.flux2_klein`) shares.

The hooks reproduce `Flux2Pipeline.__call__` exactly:
- **The prompt.** The pipeline's own `encode_prompt`: the prompt in a Mistral chat after FLUX.2's system message,
  padded to 512 tokens, and the text encoder's hidden states 10, 20 and 30 stacked per token
  (`Mistral3ForConditionalGeneration`; (1, 512, 3 x 5120) for the published model). The text's position ids are
  (0, 0, 0, token). Guidance-distilled: one branch a step, `guidance_scale` an input of the transformer; the
  pipeline takes no negative prompt, so a row's `negative_prompt` is ignored.
- **The noise** is drawn as the pipeline draws it (`prepare_latents`: (1, 4 c, h / 16, w / 16), packed to tokens
  with position ids (0, row, column, 0)), in the text encoder's dtype.
- **The schedule.** Sigmas `linspace(1, 1 / steps, steps)`, shifted by FLUX.2's empirical `mu` of the noise's
  token count and the step count (`compute_empirical_mu`).
- **A reference image** (the row's `image`, optional): checked, resized to a megapixel when larger, cut down to a
  multiple of 16 (centre crop) and VAE-encoded (its mode) as the pipeline does; its latent, batch-normalised by
  the VAE's running statistics and packed, follows the noise's tokens in the one image stream, with position ids
  (10, row, column, 0); the prediction keeps the noise's tokens. So sequence parallelism splits both as one
  stream, and the encode runs patch-parallel over the job group.
- **The decode.** The tokens are unpacked by their position ids, un-normalised by the VAE's batch-norm running
  mean and standard deviation, unpatchified (2 x 2) and decoded.

The transformer (`Flux2Transformer2DModel`) has 8 dual-stream blocks then 48 single-stream ones; its AdaLN
modulations are computed once per forward, outside the blocks. Sequence parallelism uses diffusers' own
`_cp_plan` (both streams and both position-id tables split at the root, the output gathered after `proj_out`);
tensor parallelism splits the heads, the gated MLPs' [gate, up] and the single blocks' fused
[q, k, v, gate, up] projection by their packed blocks (`PACKED_COLWISE`), and the modulations. PipeFusion cuts the
56 blocks anywhere: a dual-stream block hands on the text and image streams, a single-stream block one tensor of
both joined (`TransformerParts.list_carried`), and a stage ending the dual-stream list sends its two streams joined
as the model joins them. The step caches span the single-stream blocks (`TransformerParts.cache_lists`), whose
outputs agree in shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import flux2_tiny, vae_costs, vae_rules
from genbatch.models.base import (
    COLWISE,
    GATHERED_COLWISE,
    HEADS,
    JOINT,
    PACKED_COLWISE,
    PACKED_ROWWISE,
    ROWWISE,
    AttentionSite,
    Blocks,
    ModelFamily,
    SequenceSplits,
    TensorSplits,
    TinyPreset,
    TransformerParts,
    decoder_tensor_splits,
)
from genbatch.models.hooks import COND, Conditioning, FamilyHooks, TokenGrid, Trajectory
from genbatch.models.shapes import ImageEncode, Published
from genbatch.models.spec import ModelSpec

MAX_SEQUENCE_LENGTH = 512
"""Text tokens a prompt is padded (and cut) to: the pipelines' `max_sequence_length` default."""
TEXT_LAYERS = (10, 20, 30)
"""The Mistral 3 hidden states `Flux2Pipeline` stacks (its `text_encoder_out_layers` default)."""
SAMPLE_SIZE = 128
"""The pipelines' `default_sample_size` (latent pixels)."""
REFERENCE_AREA = 1024 * 1024
"""Pixels above which a reference image is resized down (at its aspect ratio), as the pipelines do."""
CALL_DEFAULTS = {"width": None, "height": None, "num_inference_steps": 50, "guidance_scale": 4.0}
"""`Flux2Pipeline.__call__`'s defaults (sizes: the default sample size times the VAE factor)."""


def flux2_spec(name: str, family: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
               defaults: Mapping[str, float | int], path: str | None, *, uses_cfg: bool) -> ModelSpec:
    """A FLUX.2 model's spec: 2 x 2 latent pixels a token (16 pixels with the 8x VAE), dual- and single-stream
    blocks, 512 text tokens joined with the image's, an optional reference image whose tokens join them too."""
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    layers = {"transformer_blocks": transformer["num_layers"],
              "single_transformer_blocks": transformer["num_single_layers"]}
    return ModelSpec(
        name=name, family=family, is_video=False, uses_cfg=uses_cfg, size_multiple=spatial * 2, frame_multiple=1,
        vae_spatial=spatial, patch_size=(2, 2), num_layers=sum(layers.values()), num_heads=heads, head_dim=head_dim,
        text_tokens=MAX_SEQUENCE_LENGTH, joint_text=True,
        ffn_dim=int(heads * head_dim * transformer.get("mlp_ratio", 3.0)), mlp_matrices=3,  # SwiGLU
        out_channels=transformer.get("in_channels", 128) // 4,  # per latent pixel; 4 of them make a token
        defaults=dict(defaults), path=path, media_inputs=("image",), joins_image_tokens=True,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer(layers),
    )


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    if defaults is None:
        spatial = 2 ** (len(vae["block_out_channels"]) - 1)
        defaults = {**CALL_DEFAULTS, "width": SAMPLE_SIZE * spatial, "height": SAMPLE_SIZE * spatial}
    return flux2_spec(name, "flux2", transformer, vae, defaults, path, uses_cfg=False)


class Flux2Hooks(FamilyHooks):
    """FLUX.2 [dev]: one branch a step, the guidance scale an input of the transformer; [klein] derives from it."""

    name = "flux2"
    text_layers: tuple[int, ...] = TEXT_LAYERS
    """The text encoder's hidden states the pipeline stacks."""
    per_row_shared = ("guidance", "image_latents")
    shared_branch_keys = ("txt_ids",)

    def prompt_branch(self, pipe, text: str, device) -> dict:
        """One prompt through the pipeline's `encode_prompt`: the stacked hidden states (1, 512, 3 d) and the
        text's position ids (1, 512, 4)."""
        embeds, text_ids = pipe.encode_prompt(prompt=text, device=device, num_images_per_prompt=1,
                                              max_sequence_length=MAX_SEQUENCE_LENGTH,
                                              text_encoder_out_layers=self.text_layers)
        return {"encoder_hidden_states": embeds, "txt_ids": text_ids}

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        return Conditioning(branches={COND: self.prompt_branch(pipe, job.prompt, device)},
                            guidance_scale=job.guidance_scale)

    @staticmethod
    def reference_pixels(pipe, image):
        """A reference image as `__call__` prepares it: checked (64 px a side at least, aspect at most 8), resized
        to a megapixel when larger, each side cut down to a multiple of 16 (a centre crop): (1, 3, h, w)."""
        processor = pipe.image_processor
        processor.check_image_input(image)
        width, height = image.size
        if width * height > REFERENCE_AREA:
            image = processor._resize_to_target_area(image, REFERENCE_AREA)
            width, height = image.size
        multiple = pipe.vae_scale_factor * 2
        width, height = width // multiple * multiple, height // multiple * multiple
        return processor.preprocess(image, height=height, width=width, resize_mode="crop")

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch

        # the noise in the prompt embeddings' dtype, which is the text encoder's
        latents, latent_ids = pipe.prepare_latents(
            batch_size=1, num_latents_channels=pipe.transformer.config.in_channels // 4, height=job.height,
            width=job.width, dtype=pipe.text_encoder.dtype, device=device, generator=generator)
        shared: dict[str, Any] = {"img_ids": latent_ids, "image_latents": None}
        if "image" in job.media:
            pixels = self.reference_pixels(pipe, job.media["image"].image)
            # the image's latent (its mode: no noise drawn), batch-normalised and packed: (1, m, 4 c)
            image_latents, image_ids = pipe.prepare_image_latents(images=[pixels], batch_size=1, generator=generator,
                                                                  device=device, dtype=pipe.vae.dtype)
            # (1, n, 4) + (1, m, 4) -> (1, n + m, 4): the image stream's positions, the noise's first
            shared.update(image_latents=image_latents, img_ids=torch.cat([latent_ids, image_ids], dim=1))
        timesteps = self.schedule(pipe, job, latents, device)
        shared["guidance"] = self.guidance(pipe, job, latents, device)
        if hasattr(pipe.scheduler, "set_begin_index"):
            pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared=shared)

    def batch_trajectory(self, rows: list[Trajectory]) -> Trajectory:
        """The rows' trajectories joined (`FamilyHooks.batch_trajectory`); their reference images, whose tokens join
        the image stream (and whose positions are the first row's), must have one size."""
        sizes = {None if row.shared.get("image_latents") is None else tuple(row.shared["image_latents"].shape)
                 for row in rows}
        if len(sizes) > 1:
            shapes = ", ".join(sorted(map(str, sizes)))
            raise ValueError(f"the rows of one batch carry reference images of different sizes (latents {shapes}); "
                             "give the rows of a batch images of one size, or run them with --batch-size 1")
        return super().batch_trajectory(rows)

    @staticmethod
    def schedule(pipe, job: JobSpec, latents, device):
        """The timesteps for the packed noise `latents` (1, n, c): sigmas shifted by FLUX.2's empirical mu of n
        and the step count."""
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, retrieve_timesteps

        steps = job.num_inference_steps
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=steps)
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        return timesteps

    @staticmethod
    def guidance(pipe, job: JobSpec, latents, device):
        """The guidance-distilled transformer's guidance input, one per row."""
        import torch

        return torch.full([1], job.guidance_scale, device=device, dtype=torch.float32).expand(latents.shape[0])

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        image_latents = trajectory.shared.get("image_latents")
        # (b, n, c) + (b, m, c) -> (b, n + m, c): one image stream; the prediction keeps the noise's n tokens
        stream = latents if image_latents is None else torch.cat([latents, image_latents], dim=1)
        prediction = pipe.transformer(
            hidden_states=stream.to(pipe.transformer.dtype), timestep=timestep / 1000,
            guidance=trajectory.shared.get("guidance"), img_ids=trajectory.shared["img_ids"],
            joint_attention_kwargs=None, return_dict=False, **branch,
        )[0]
        return prediction[:, :latents.shape[1]]

    def conditioning_grids(self, pipe, trajectory: Trajectory) -> tuple[TokenGrid, ...]:
        """The reference image's grid after the noise's (none without one): its position ids are
        (10, row, column, 0), so a row holds the largest column plus one."""
        image_latents = trajectory.shared.get("image_latents")
        if image_latents is None:
            return ()
        tokens = image_latents.shape[1]  # (b, m, c): the same m for every row of a batch
        image_ids = trajectory.shared["img_ids"][0, -tokens:]  # (m, 4), after the noise's
        return (TokenGrid(tokens=tokens, row_tokens=int(image_ids[:, 2].max()) + 1),)

    def combine(self, predictions, guidance_scale: float, t):
        return predictions[COND]

    def vae_input(self, pipe, job: JobSpec, latents):
        import torch

        factor = pipe.vae_scale_factor * 2
        grid = torch.empty(1, 0, job.height // factor, job.width // factor)  # the noise's token grid
        # (1, h/16 * w/16, 4 c) -> (1, 4 c, h/16, w/16) by the tokens' position ids
        latents = pipe._unpack_latents_with_ids(latents, pipe._prepare_latent_ids(grid).to(latents.device))
        bn = pipe.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps).to(latents.device,
                                                                                               latents.dtype)
        # (1, 4 c, h/16, w/16) -> (1, c, h/8, w/8): un-normalised, then the 2 x 2 patches unpacked
        latents = pipe._unpatchify_latents(latents * std + mean)
        return latents.to(next(pipe.vae.parameters()).device)

    def postprocess(self, pipe, decoded):
        # (1, 3, h, w) -> (h, w, 3) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]


_JOINT = ("encoder_hidden_states", "hidden_states")  # the transformer's order: [text, image]
_DUAL_ATTN = "transformer_blocks.*.attn"

TENSOR_SPLITS = TensorSplits(
    styles={
        **{f"{_DUAL_ATTN}.{name}": COLWISE for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj",
                                                        "add_v_proj")},
        f"{_DUAL_ATTN}.to_out.0": ROWWISE, f"{_DUAL_ATTN}.to_add_out": ROWWISE, _DUAL_ATTN: HEADS,
        # SwiGLU MLPs: the fused [gate, up] projection split half by half, the output row-wise
        **{f"transformer_blocks.*.{mlp}.linear_in": PACKED_COLWISE for mlp in ("ff", "ff_context")},
        **{f"transformer_blocks.*.{mlp}.linear_out": ROWWISE for mlp in ("ff", "ff_context")},
        # single-stream: [q, k, v, gate, up] split block by block (its processor splits q/k/v from the MLP by the
        # whole model's ratio, so every rank's share keeps it), [attention, MLP] row-wise by block
        "single_transformer_blocks.*.attn.to_qkv_mlp_proj": PACKED_COLWISE,
        "single_transformer_blocks.*.attn.to_out": PACKED_ROWWISE,
        # the AdaLN modulations, computed once per forward outside the blocks
        **{f"{name}.linear": GATHERED_COLWISE for name in ("double_stream_modulation_img",
                                                           "double_stream_modulation_txt",
                                                           "single_stream_modulation", "norm_out")},
    },
    # dual-stream: attention and MLP outputs of both streams; single-stream: one fused output projection
    all_reduces={"transformer_blocks": 2, "single_transformer_blocks": 1},
)
"""FLUX.2's tensor splits (diffusers' `_tp_plan` packs column-wise, which genbatch spells `PACKED_COLWISE`, and keeps
the modulations whole; here they are split and gathered)."""

TRANSFORMER_PARTS = TransformerParts(
    blocks=Blocks(before=("pos_embed", "time_guidance_embed", "double_stream_modulation_img",
                          "double_stream_modulation_txt", "single_stream_modulation", "x_embedder",
                          "context_embedder"),
                  repeated=("transformer_blocks", "single_transformer_blocks"), after=("norm_out", "proj_out")),
    # joint attention over [text, image] in the dual- and single-stream blocks; both streams split
    attention=(AttentionSite(pattern=_DUAL_ATTN, kind=JOINT, streams=_JOINT),
               AttentionSite(pattern="single_transformer_blocks.*.attn", kind=JOINT, streams=_JOINT)),
    sequence=SequenceSplits(text_streams=("encoder_hidden_states", "txt_ids")),  # diffusers' own _cp_plan
    tensor_splits=TENSOR_SPLITS,
    # diffusers' _repeated_blocks: Flux2TransformerBlock, Flux2SingleTransformerBlock
    compile_units=("transformer_blocks.*", "single_transformer_blocks.*"),
    # a dual-stream block returns the two streams; a single-stream block one tensor, [text, image] joined as the
    # model joins them between the lists (so a stage ending the dual-stream list sends them joined)
    carried=("encoder_hidden_states", "hidden_states"),
    list_carried={"single_transformer_blocks": ("hidden_states",)},
    # First-Block Cache's residual spans blocks that hand on alike: the single-stream ones (48 of [dev]'s 56)
    cache_lists=("single_transformer_blocks",),
)
"""`Flux2Transformer2DModel`, [dev]'s and [klein]'s."""

MISTRAL3 = Blocks(before=("model.language_model.embed_tokens",),
                  repeated=("model.vision_tower.transformer.layers", "model.language_model.layers"),
                  after=("model.language_model.norm", "lm_head"))
"""`Mistral3ForConditionalGeneration`: its Pixtral vision tower idles on text."""

# black-forest-labs/FLUX.2-dev, as diffusers' scripts/convert_flux2_to_diffusers.py writes it (flux2-dev)
PUBLISHED_TRANSFORMER = dict(patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
                             num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256,
                             mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6,
                             guidance_embeds=True)
PUBLISHED_VAE = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=32,
                     norm_num_groups=32, use_quant_conv=True, use_post_quant_conv=True, patch_size=(2, 2))
"""`AutoencoderKLFlux2()`'s defaults, which the conversion script saves: 84.0M parameters."""
PUBLISHED_TEXT_ENCODER = dict(hidden_size=5120, intermediate_size=32768, num_hidden_layers=40, num_attention_heads=32,
                              num_key_value_heads=8, head_dim=128, vocab_size=131072)
"""Mistral-Small-3.2-24B-Instruct-2506's language model (the script's text encoder), with a 24-layer Pixtral tower
(1024 wide): 24.01B parameters built from the config, 22.23B of them in the language model's 40 layers."""
PUBLISHED_CONFIG = {"transformer": PUBLISHED_TRANSFORMER, "vae": PUBLISHED_VAE, "text_encoder": PUBLISHED_TEXT_ENCODER}
"""FLUX.2 [dev]'s published configs, which its planner shape is built from."""


def published(name: str, hub_id: str, transformer: Mapping[str, Any], *, parameters: float, text_encoder: float,
              text_encoder_split: float, steps: int, distilled: bool = False) -> Published:
    """A published FLUX.2 model: its transformer config (the VAE is FLUX.2's one), its parameter counts (each counted
    on the diffusers/transformers class built from the published config), and its model card's steps."""
    return Published(name=name, hub_id=hub_id, transformer=transformer, vae=PUBLISHED_VAE,
                     defaults={**CALL_DEFAULTS, "width": 1024, "height": 1024, "num_inference_steps": steps},
                     parameters=parameters, text_encoder_parameters=text_encoder,
                     text_encoder_split_parameters=text_encoder_split, vae_parameters=0.084e9,
                     spec_facts={"uses_cfg": False} if distilled else {})


IMAGE_ENCODE = ImageEncode(video=False, area=None, multiple=16, required=False)
"""A reference image, optional: the pipeline keeps one of a megapixel or less at its own size (a larger one is
resized to a megapixel), so the planner, which does not see it, takes it at the output's size."""

FAMILY = ModelFamily(
    name="flux2",
    pipelines=("Flux2Pipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=Flux2Hooks(),
    transformers={"Flux2Transformer2DModel": TRANSFORMER_PARTS},
    text_encoders={"Mistral3ForConditionalGeneration": MISTRAL3},
    text_encoder_splits={"Mistral3ForConditionalGeneration": decoder_tensor_splits("model.language_model.layers")},
    vae_classes=("diffusers:AutoencoderKLFlux2",),
    vae_rules=vae_rules.AUTOENCODER_KL,  # diffusers' Encoder and Decoder, as AutoencoderKL's
    presets=(TinyPreset(name="tiny-flux2", transformer=flux2_tiny.TINY_TRANSFORMER, vae=flux2_tiny.TINY_VAE,
                        defaults=flux2_tiny.DEFAULTS["tiny-flux2"], build=flux2_tiny.build_dev),),
    vae_costs=vae_costs.FLUX2_VAE,
    published=(published("flux.2-dev", "black-forest-labs/FLUX.2-dev", PUBLISHED_TRANSFORMER, parameters=32.22e9,
                         text_encoder=24.01e9, text_encoder_split=22.23e9, steps=50),),
    image_encode=IMAGE_ENCODE,
)
