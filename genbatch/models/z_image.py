"""Z-Image and Z-Image-Turbo text-to-image (`diffusers.ZImagePipeline`): everything genbatch knows about the family.

`ZImageTransformer2DModel` is a single-stream DiT (S3-DiT). The image's patches go through two refiner blocks of
their own (`noise_refiner`, timestep-modulated), the caption's through two more (`context_refiner`, unmodulated),
then one sequence [image, caption] runs through the main blocks (`layers`); the image's tokens are read back out.
The caption is Qwen3's hidden states one layer below the last (`hidden_states[-2]`), of the prompt in Qwen3's
chat template with `enable_thinking=True`, the padding dropped (each row keeps its own length). The VAE is
FLUX.1's `AutoencoderKL`.

Guidance is true CFG whenever `guidance_scale > 0` (not > 1): a second forward on the negative prompt (the empty
prompt when the row names none), combined as `cond + scale * (cond - uncond)` (the pipeline's form), optionally
renormalised (`cfg_normalization`) and switched off late in the trajectory (`cfg_truncation`); both are the
model's defaults (`spec.defaults`), the pipeline's own unless a preset sets them. Z-Image-Turbo runs at
`guidance_scale` 0: one forward a step. The denoise hooks reproduce `ZImagePipeline.__call__` exactly (its
branches batched into one forward there, run apart here: equal within fp32 rounding, as SD3's).

Sequence parallelism (`SEQUENCE`): the image refiner blocks attend over the image's tokens alone, so each one is
split and gathered on its own (its input split, its attention over every rank's share, its output all-gathered),
the caption refiner runs whole on every rank (the caption is short), and the main blocks split the joined
[image, caption] sequence at the first block and gather it after the final layer. PipeFusion is not declared:
the main blocks' one stream holds the caption with the image, joined inside the model, so a patch cannot keep
the caption whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import tiny_configs, vae_costs, vae_rules
from genbatch.models.base import (
    COLWISE,
    GATHERED_COLWISE,
    HEADS,
    ROWWISE,
    SELF,
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
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, Trajectory
from genbatch.models.shapes import Published
from genbatch.models.spec import ModelSpec

MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline.__call__'s default
TEXT_TOKENS = 256
"""Caption tokens the planner counts per prompt: the pipeline keeps a prompt's own tokens (at most 512, padded to a
multiple of 32 in the transformer)."""

CALL_DEFAULTS = {"width": 1024, "height": 1024, "num_inference_steps": 50, "guidance_scale": 5.0,
                 "cfg_normalization": 0.0, "cfg_truncation": 1.0}
"""ZImagePipeline.__call__'s defaults (`cfg_normalization` False is 0.0: off). Z-Image-Turbo's model card runs it
at `guidance_scale` 0 and 9 steps: give those in the manifest or with --guidance-scale / --steps."""

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""Qwen3's chat template for plain text messages (what the pipeline renders the prompt with): with
`enable_thinking=True` the assistant's turn is opened and left empty."""

TINY_TRANSFORMER = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=96, n_layers=2,
                        n_refiner_layers=2, n_heads=4, n_kv_heads=4, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32,
                        rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 8, 8], axes_lens=[1024, 64, 64])
"""Z-Image's transformer at width 96 (4 heads of 24, rotary axes 8 + 8 + 8; MLP 256), its published depth of
refiners (2 + 2) and two main blocks; the caption axis long enough for a 512-token caption and the image after it."""
TINY_TEXT_ENCODER = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=None, eos_token_id=1)
"""A two-layer Qwen3: `hidden_states[-2]` is its first layer's output."""
TINY_DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 5.0,
                 "cfg_normalization": 0.0, "cfg_truncation": 1.0}

PUBLISHED_TRANSFORMER = {
    "all_f_patch_size": [1], "all_patch_size": [2], "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512],
    "cap_feat_dim": 2560, "dim": 3840, "in_channels": 16, "n_heads": 30, "n_kv_heads": 30, "n_layers": 30,
    "n_refiner_layers": 2, "norm_eps": 1e-05, "qk_norm": True, "rope_theta": 256.0, "t_scale": 1000.0,
}
"""Tongyi-MAI/Z-Image-Turbo transformer/config.json (Z-Image's is the same architecture): 6.15B parameters."""
PUBLISHED_VAE = {
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512], "force_upcast": True, "in_channels": 3,
    "latent_channels": 16, "layers_per_block": 2, "mid_block_add_attention": True, "norm_num_groups": 32,
    "out_channels": 3, "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
    "use_post_quant_conv": False, "use_quant_conv": False,
}
"""Tongyi-MAI/Z-Image-Turbo vae/config.json: FLUX.1's AutoencoderKL."""
PUBLISHED_TEXT_ENCODER = {
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 2560, "intermediate_size": 9728,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "tie_word_embeddings": True,
    "vocab_size": 151936,
}
"""Tongyi-MAI/Z-Image-Turbo text_encoder/config.json: Qwen3-4B (4.02B parameters), loaded as Qwen3Model."""
PUBLISHED_SCHEDULER = {"num_train_timesteps": 1000, "use_dynamic_shifting": False, "shift": 3.0}
"""Tongyi-MAI/Z-Image-Turbo scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler)."""
# The configs as the model's published files give them (the Hugging Face repository Tongyi-MAI/Z-Image-Turbo, quoted
# verbatim in public test fixtures); the text encoder's size is Qwen3-4B's, the transformer's counted from the config.


def ffn_width(dim: int) -> int:
    """The MLP inner width of a Z-Image block of width `dim` (its `FeedForward(dim, int(dim / 3 * 8))`)."""
    return int(dim / 3 * 8)


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = 2 ** (len(vae["block_out_channels"]) - 1)  # ZImagePipeline.vae_scale_factor
    patch = int(transformer.get("all_patch_size", (2,))[0])
    heads, dim = transformer["n_heads"], transformer["dim"]
    refiners, layers = transformer.get("n_refiner_layers", 2), transformer["n_layers"]
    return ModelSpec(
        name=name,
        family="z-image",
        is_video=False,
        uses_cfg=True,
        size_multiple=spatial * patch,  # the pipeline refuses sizes that are not multiples of 16
        frame_multiple=1,
        vae_spatial=spatial,
        patch_size=(patch, patch),
        # the main blocks and the image refiners run over the image's tokens; the caption refiners over the caption
        num_layers=layers + refiners,
        num_heads=heads,
        head_dim=dim // heads,
        text_tokens=TEXT_TOKENS,
        joint_text=True,
        ffn_dim=ffn_width(dim),
        mlp_matrices=3,  # SwiGLU: w1, w3 and w2
        out_channels=transformer.get("in_channels", 16),
        defaults=dict(CALL_DEFAULTS if defaults is None else defaults),
        path=path,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer({"noise_refiner": refiners, "layers": layers}),
    )


class ZImageGuidance(float):
    """A row's guidance scale (the float itself) with the model's `cfg_normalization` and `cfg_truncation`, which
    `ZImagePipeline.__call__` applies when it combines the branches (`Conditioning.guidance_scale`)."""

    normalization: float
    """The largest norm of the guided prediction, in norms of the conditional one (0: not renormalised)."""
    truncation: float
    """CFG stops once `(1000 - t) / 1000` exceeds this (1.0 and above: never)."""

    def __new__(cls, scale: float, normalization: float = 0.0, truncation: float = 1.0):
        value = super().__new__(cls, scale)
        value.normalization, value.truncation = float(normalization), float(truncation)
        return value

    def __reduce__(self):
        return type(self), (float(self), self.normalization, self.truncation)


def scale_at(guidance: float, t) -> float:
    """The guidance scale the pipeline applies at timestep `t`: 0 once CFG is truncated there."""
    truncation = getattr(guidance, "truncation", 1.0)
    if truncation <= 1 and ((1000 - t.float()) / 1000).item() > truncation:
        return 0.0
    return float(guidance)


def z_image_cfg(predictions, guidance: float, t):
    """ZImagePipeline's CFG of the branch predictions (b, c, h, w), row by row: `cond + s * (cond - uncond)`,
    scaled down to `cfg_normalization` times the conditional prediction's norm when it is longer; the conditional
    prediction alone with one branch or where CFG is truncated. Returns the negated result, which is what the
    pipeline hands to the scheduler."""
    import torch

    cond = predictions[COND]
    scale = scale_at(guidance, t)
    if UNCOND not in predictions or scale == 0:
        return -cond
    normalization = getattr(guidance, "normalization", 0.0)
    rows = []
    for pos, neg in zip(cond, predictions[UNCOND], strict=True):
        pred = pos + scale * (pos - neg)
        if normalization > 0.0:
            ori_pos_norm = torch.linalg.vector_norm(pos)
            new_pos_norm = torch.linalg.vector_norm(pred)
            max_new_norm = ori_pos_norm * normalization
            if new_pos_norm > max_new_norm:
                pred = pred * (max_new_norm / new_pos_norm)
        rows.append(pred)
    return -torch.stack(rows, dim=0)


def _cfg_settings(job: JobSpec) -> tuple[float, float]:
    from genbatch.models.resolve import resolve_model

    defaults = resolve_model(job.model).defaults
    return float(defaults.get("cfg_normalization", 0.0)), float(defaults.get("cfg_truncation", 1.0))


class ZImageHooks(FamilyHooks):
    """Z-Image: one forward a step at guidance 0 (Turbo), two above it; the caption of each row its own length."""

    name = "z-image"

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        texts = {COND: job.prompt}
        if job.guidance_scale > 0:
            texts[UNCOND] = job.negative_prompt or ""  # the pipeline's negative when none is given: ""
        branches = {}
        for branch, text in texts.items():
            (caption,) = pipe.encode_prompt(prompt=text, device=device, do_classifier_free_guidance=False,
                                            max_sequence_length=MAX_SEQUENCE_LENGTH)[0]
            branches[branch] = {"cap_feats": caption.unsqueeze(0)}  # (n, d) -> (1, n, d): one row, its own n
        return Conditioning(branches=branches, guidance_scale=ZImageGuidance(job.guidance_scale, *_cfg_settings(job)))

    def batch_conditioning(self, rows: list[Conditioning]) -> Conditioning:
        """The rows' captions as the transformer takes a batch of them: a list of (n_i, d), each its own length
        (the transformer pads them to the longest and masks the padding, as for the pipeline's list of prompts)."""
        if len(rows) == 1:
            return super().batch_conditioning(rows)
        captions = {name: [caption for row in rows for caption in _captions(row.branches[name])]
                    for name in rows[0].branches}
        joined = super().batch_conditioning([Conditioning(branches={name: {} for name in row.branches},
                                                          guidance_scale=row.guidance_scale) for row in rows])
        return Conditioning(branches={name: {"cap_feats": captions[name]} for name in joined.branches},
                            guidance_scale=joined.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch
        from diffusers.pipelines.z_image.pipeline_z_image import (
            calculate_shift,
            get_default_z_image_sigmas,
            retrieve_timesteps,
        )

        # (1, c, H / 8, W / 8), fp32, as the pipeline draws it
        latents = pipe.prepare_latents(1, pipe.transformer.in_channels, job.height, job.width, torch.float32, device,
                                       generator)
        config = pipe.scheduler.config
        mu = calculate_shift((latents.shape[2] // 2) * (latents.shape[3] // 2), config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                             config.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, job.num_inference_steps, device,
                                          sigmas=get_default_z_image_sigmas(job.num_inference_steps), mu=mu)
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps)

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        # (b, c, h, w) -> b x (c, 1, h, w): one frame each, as the transformer takes a batch
        images = list(latents.to(pipe.transformer.dtype).unsqueeze(2).unbind(dim=0))
        timestep = (1000 - t.expand(latents.shape[0])) / 1000
        out = pipe.transformer(images, timestep, _captions(branch), return_dict=False)[0]
        # b x (c, 1, h, w) -> (b, c, h, w)
        return torch.stack([item.float() for item in out], dim=0).squeeze(2)

    def combine(self, predictions, guidance_scale: float, t):
        return z_image_cfg(predictions, guidance_scale, t)

    def vae_input(self, pipe, job: JobSpec, latents):
        latents = latents.to(pipe.vae.dtype)
        latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        return latents.to(next(pipe.vae.parameters()).device)

    def postprocess(self, pipe, decoded):
        # (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]


def _captions(branch: Mapping[str, Any]) -> list:
    """A branch's captions as a list of (n_i, d): one row's (1, n, d) tensor, or a batch's list."""
    captions = branch["cap_feats"]
    return list(captions) if isinstance(captions, list) else list(captions.unbind(dim=0))


def tiny_tokenizer():
    """A tokenizer of Qwen3's chat template (`genbatch.models.prompt_tokenizer`), the template its own."""
    from genbatch.models.prompt_tokenizer import _pieces, template_tokenizer

    head = "<|im_start|>user\n"
    tokenizer = template_tokenizer(head + "{}<|im_end|>\n<|im_start|>assistant\n", len(_pieces(head)),
                                   MAX_SEQUENCE_LENGTH)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny(meta: frozenset[str] = frozenset()):
    """Z-Image: ZImageTransformer2DModel (`TINY_TRANSFORMER`), FLUX.1's tiny AutoencoderKL, a two-layer Qwen3Model
    and flow-match Euler with Z-Image-Turbo's static shift."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from genbatch.models.tiny import seeded

    tokenizer = tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), **TINY_TEXT_ENCODER)
    text_encoder = seeded(0, lambda: Qwen3Model(config), "text_encoder", meta)
    transformer = seeded(1, lambda: _scaled(ZImageTransformer2DModel(**TINY_TRANSFORMER)), "transformer", meta)
    vae = seeded(2, lambda: AutoencoderKL(**tiny_configs.TINY_FLUX_VAE))
    scheduler = FlowMatchEulerDiscreteScheduler(**PUBLISHED_SCHEDULER)
    return ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                          transformer=transformer)


def _scaled(transformer):
    """The random transformer with its caption embedder 4x stronger, so that the prompt visibly reaches the image
    (with the default initialisation two prompts differ by a few levels); deterministic, on any device."""
    import torch

    if transformer.cap_embedder[1].weight.device.type != "meta":
        with torch.no_grad():
            transformer.cap_embedder[1].weight.mul_(4.0)
    return transformer


def _block_styles(blocks: str, modulated: bool) -> dict[str, str]:
    """The tensor styles of a Z-Image block list: q, k, v by heads, the attention's output and the SwiGLU's `w2`
    row-wise, `w1` and `w3` column-wise, the AdaLN modulation gathered."""
    attention = f"{blocks}.*.attention"
    styles = {**{f"{attention}.{name}": COLWISE for name in ("to_q", "to_k", "to_v")}, f"{attention}.to_out.0": ROWWISE,
              attention: HEADS, f"{blocks}.*.feed_forward.w1": COLWISE, f"{blocks}.*.feed_forward.w3": COLWISE,
              f"{blocks}.*.feed_forward.w2": ROWWISE}
    if modulated:
        styles[f"{blocks}.*.adaLN_modulation.0"] = GATHERED_COLWISE
    return styles


TENSOR_SPLITS = TensorSplits(
    styles={**_block_styles("noise_refiner", True), **_block_styles("context_refiner", False),
            **_block_styles("layers", True)},
    # each block all-reduces its attention output and its MLP output
    all_reduces={"noise_refiner": 2, "context_refiner": 2, "layers": 2},
)
"""Z-Image's tensor splits (diffusers gives the class none): every block's heads and MLP split."""

_TOKENS = Split(dim=1, expected_dims=3)
"""A block's token input `x` or its rotary table `freqs_cis`, (b, s, d) each, cut along the tokens."""

SEQUENCE = SequenceSplits(points={
    # each image refiner block alone: its input and its rotary table split, its output gathered (the caption
    # refiners, and the joining of [image, caption] after them, read the whole image). A block takes one entry per
    # pattern, so the split and the gather name the same blocks by two patterns, each one character after the
    # dot: blocks 0-9 (Z-Image has 2; a `*` would match the blocks' submodules too)
    "noise_refiner.?": {"x": _TOKENS, "freqs_cis": _TOKENS},
    "noise_refiner.[0-9]": Gather(dim=1, expected_dims=3),
    # the main blocks: [image, caption] split at the first block, which hands its split output to the next; the
    # model hands every block the whole rotary table, which each block's attention splits (a key-padding mask, when
    # the rows of a batch differ in caption length, is left whole: the attention cuts it by rank); gathered after
    # the final layer
    "layers.0": {"x": _TOKENS},
    "layers.*.attention": {"freqs_cis": _TOKENS},
    "all_final_layer.2-1": Gather(dim=1, expected_dims=3),
}, output_stream="x")
"""Z-Image's sequence-parallel splits (diffusers gives the class none)."""

FAMILY = ModelFamily(
    name="z-image",
    pipelines=("ZImagePipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=ZImageHooks(),
    transformers={
        "ZImageTransformer2DModel": TransformerParts(
            # the refiners are not repeated blocks here: they run over other streams than the main blocks (the
            # image's alone, the caption's alone), and a step cache's span (First-Block Cache) must start and end
            # in one stream; FSDP shards them with the root
            blocks=Blocks(before=("t_embedder", "all_x_embedder", "noise_refiner", "cap_embedder", "context_refiner"),
                          repeated=("layers",), after=("all_final_layer",)),
            # self-attention over the image's tokens in the image refiners, over [image, caption] in the main blocks
            # (a batch's captions padded and masked); the caption refiners attend over the whole caption on every
            # rank, unrouted
            attention=(AttentionSite(pattern="noise_refiner.*.attention", kind=SELF, streams=("x",)),
                       AttentionSite(pattern="layers.*.attention", kind=SELF, streams=("x",), masked=True)),
            sequence=SEQUENCE,
            tensor_splits=TENSOR_SPLITS,
            # diffusers' _repeated_blocks: ZImageTransformerBlock, of all three lists
            compile_units=("noise_refiner.*", "context_refiner.*", "layers.*"),
        ),
    },
    text_encoders={"Qwen3Model": Blocks(before=("embed_tokens",), repeated=("layers",), after=("norm",))},
    text_encoder_splits={"Qwen3Model": decoder_tensor_splits("layers")},
    vae_classes=("diffusers:AutoencoderKL",),
    vae_rules=vae_rules.AUTOENCODER_KL,
    presets=(TinyPreset(name="tiny-z-image", transformer=TINY_TRANSFORMER, vae=tiny_configs.TINY_FLUX_VAE,
                        defaults=TINY_DEFAULTS, build=build_tiny),),
    vae_costs=vae_costs.IMAGE_VAE,
    published=(
        Published(name="z-image-turbo", hub_id="Tongyi-MAI/Z-Image-Turbo", transformer=PUBLISHED_TRANSFORMER,
                  vae=PUBLISHED_VAE, defaults={**CALL_DEFAULTS, "num_inference_steps": 9, "guidance_scale": 0.0},
                  parameters=6.15e9, text_encoder_parameters=4.02e9,  # Qwen3-4B
                  vae_parameters=0.084e9,
                  spec_facts={"uses_cfg": False}),  # distilled, the model card's 9 steps at guidance 0: one branch
    ),
)
