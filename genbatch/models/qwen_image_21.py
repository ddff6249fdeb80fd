"""Qwen-Image 2.1 (`diffusers.QwenImage21Pipeline`): text-to-image, and image-conditioned generation from the row's
`image`; everything genbatch knows about the family.

`QwenImage21Transformer2DModel` is a single-stream, block-causal transformer. One sequence holds the prompt's
tokens (Qwen3-VL's last decoder layer before its final norm, the system prompt cut off), a condition image's latent
tokens in the places Qwen3-VL gave its vision tokens (each vision token stands for 2 x 2 latent tokens), and the
output's latent tokens last (one a 16 x 16 pixel tile: the latents go in unpatched). Attention is causal over the
sequence and bidirectional inside each image; text and condition-image tokens are modulated as at t = 0, so their
keys and values do not change from step to step: the pipeline computes them at the first step and keeps them
(`use_kv_cache`, on by default), and every later step computes the output's tokens alone against that cache.
The denoise hooks reproduce `QwenImage21Pipeline.__call__` exactly, its key/value cache included (a resumed job
fills it again at its first step, from the same tokens, before that step's forward).

Guidance is true CFG (`true_cfg_scale`, the manifest's `guidance_scale`), on when the scale is above 1 and the row
gives a `negative_prompt`, plain `uncond + scale * (cond - uncond)`; the pipeline's default scale is 1 (the model is
sampled without guidance). A directory whose `model_index.json` sets `sample_sigmas` (Qwen-Image-2.1-Turbo) samples
on that grid, as the pipeline does: its rows run that many steps.

The row's `image` (optional) is the condition image: resized, as the pipeline resizes it, to about
`output_resolution`^2 pixels (1024^2; the tiny preset's 64^2) at its aspect ratio, each side a multiple of 32,
seen by Qwen3-VL in the prompt's template (over white where it is transparent) and encoded by the VAE into the
sequence. The output is the row's `width` x `height` (multiples of 32). The VAE (`AutoencoderKLQwenImage21`)
decodes four channels, RGBA: genbatch writes the RGB ones (its PNGs are RGB).

Layouts: Ulysses, Ring and USP, tensor parallel (diffusers' `_tp_plan`: heads and the SwiGLU split), CFG parallel,
FSDP, data parallel. Sequence parallelism splits the output's tokens and keeps the prefix whole on every rank
(`KeptPrefix`, `genbatch.parallel.kept_prefix`): the processor attends segment by segment over the prefix at the
first step (each rank computes the prefix, filling its own cache), and the output's queries attend over [the
prefix's keys, every rank's output keys] (`genbatch.parallel.attention.prefix`). No PipeFusion or DistriFusion:
their stale keys and values cannot stand for a prefix the output attends to causally. A batch of rows
(`--batch-size`) runs one forward per group of rows that share a sequence layout (the same prompt length and
condition-image grid: the transformer reads the layout from the batch's first row), so each row's output is its
own, as alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import vae_costs, vae_rules
from genbatch.models.base import (
    GATHERED_COLWISE,
    HEADS,
    JOINT,
    AttentionSite,
    Blocks,
    KeptPrefix,
    ModelFamily,
    SequenceSplits,
    TensorSplits,
    TinyPreset,
    TransformerParts,
)
from genbatch.models.hooks import COND, UNCOND, Conditioning, FamilyHooks, Trajectory, classifier_free_guidance
from genbatch.models.qwen_image import VL_ENCODER_BLOCKS, VL_ENCODER_SPLITS
from genbatch.models.shapes import ImageEncode, Published
from genbatch.models.spec import ModelSpec

VAE_SCALE = 16
"""Pixels per latent token along each side (`QwenImage21Pipeline.vae_scale_factor`, a constant of the pipeline)."""
SIZE_MULTIPLE = 2 * VAE_SCALE
"""Output sides are multiples of 32: each vision slot stands for 2 x 2 latent tokens (the pipeline floors others)."""
TEXT_TOKENS = 256
"""Prompt tokens the planner counts (the pipeline keeps a prompt's own tokens, the system prompt cut off)."""

CALL_DEFAULTS = {"width": 1024, "height": 1024, "num_inference_steps": 40, "guidance_scale": 1.0,
                 "output_resolution": 1024}
"""QwenImage21Pipeline.__call__'s defaults (guidance_scale: its `true_cfg_scale`; `output_resolution`: the side
of the area a condition image is resized to, and the default size)."""

TINY_TRANSFORMER = dict(patch_size=1, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=16,
                        num_attention_heads=4, context_in_dim=32, mlp_ratio=3, axes_dims_rope=(4, 6, 6), eps=1e-6,
                        causal_condition=True)
"""Qwen-Image 2.1's transformer at width 64 (4 heads of 16; rotary frame/height/width axes 4 + 6 + 6), two blocks."""
TINY_VAE = dict(base_dim=8, decoder_base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1, 1], num_res_blocks=1, is_residual=True,
                in_channels=4, out_channels=4, temperal_downsample=[False, True, True, True], latents_mean=[0.0] * 16,
                latents_std=[1.0] * 16)
"""AutoencoderKLQwenImage21 as published (residual blocks, RGBA in and out, 16x per side), 8 channels wide and 16
latent channels."""
TINY_TEXT = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rope_scaling={"mrope_interleaved": True, "mrope_section": [2, 1, 1],
                                                                   "rope_type": "default"},
                 pad_token_id=0, eos_token_id=1, bos_token_id=None)
"""A two-layer Qwen3-VL language model (its rotary sections add up to half its head size, 4)."""
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0],
                   num_position_embeddings=64)
"""A one-block Qwen3-VL vision tower, 16-pixel patches merged 2 x 2."""
TINY_PROCESSOR = dict(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=16, temporal_patch_size=2, merge_size=2)
"""The tiny preset's Qwen2-VL-style image processor: a condition image seen at a few thousand pixels (a handful of
vision tokens after the 2 x 2 merge)."""
TINY_DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 1.0, "output_resolution": 64}
"""The tiny preset's defaults: a condition image resized to about 64 x 64 pixels (16 latent tokens)."""
TINY_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=8192,
                      max_shift=0.9, num_train_timesteps=1000, shift=1.0, shift_terminal=0.02,
                      time_shift_type="exponential", use_dynamic_shifting=True)
"""Qwen/Qwen-Image-2.1 scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler)."""

SYSTEM_PROMPT = "Comprehend and analyze the provided prompt."
"""QwenImage21Pipeline's system prompt (its `sys_prompt`), which its processor's chat template tokenizes to find how
many leading tokens to drop."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen3-VL's chat template for text and image messages (what the pipeline tokenizes its system message with)."""

PUBLISHED_TRANSFORMER = {
    "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "context_in_dim": 4096, "in_channels": 64,
    "num_attention_heads": 32, "num_layers": 32, "out_channels": 64, "patch_size": 1, "mlp_ratio": 3, "eps": 1e-06,
    "causal_condition": True,
}
"""Qwen/Qwen-Image-2.1 transformer/config.json: 7.12B parameters (counted from the config)."""
PUBLISHED_VAE = {
    "attn_scales": [], "base_dim": 96, "decoder_base_dim": 144, "dim_mult": [1, 2, 4, 8, 8], "dropout": 0.0,
    "in_channels": 4, "is_residual": True, "num_res_blocks": 2, "out_channels": 4, "patch_size": None,
    "scale_factor_spatial": 16, "scale_factor_temporal": 8, "temperal_downsample": [False, True, True, True],
    "z_dim": 64,
}
"""Qwen/Qwen-Image-2.1 vae/config.json (its 64 latents_mean / latents_std left out): 0.34B parameters, 0.26B of them
the decoder's."""
PUBLISHED_TEXT_ENCODER = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "text_config": {"head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
                    "num_hidden_layers": 36, "num_key_value_heads": 8, "vocab_size": 151936,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                    "rope_theta": 5000000},
}
"""Qwen/Qwen-Image-2.1 text_encoder/config.json: Qwen3-VL-8B (8.77B parameters with its vision tower)."""
# The configs as the Hugging Face repository Qwen/Qwen-Image-2.1 publishes them (quoted in public test fixtures of
# projects that load it); the parameter counts are counted from them on the meta device.


def sample_sigmas(path: str | None) -> list[float] | None:
    """The sampling grid a pipeline directory's `model_index.json` configures (`sample_sigmas`), or None."""
    if path is None:
        return None
    try:
        with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
            return json.load(handle).get("sample_sigmas")
    except OSError:
        return None


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    patch = transformer.get("patch_size", 1)
    if defaults is None:
        defaults = dict(CALL_DEFAULTS)
        grid = sample_sigmas(path)
        if grid:  # the pipeline samples on the configured grid: its length is the step count
            defaults["num_inference_steps"] = len(grid)
    return ModelSpec(
        name=name,
        family="qwen-image-21",
        is_video=False,
        uses_cfg=True,
        cfg_needs_negative_prompt=True,
        size_multiple=SIZE_MULTIPLE,
        frame_multiple=1,
        vae_spatial=VAE_SCALE,
        patch_size=(patch, patch),
        num_layers=transformer["num_layers"],
        num_heads=heads,
        head_dim=head_dim,
        text_tokens=TEXT_TOKENS,
        joint_text=True,
        ffn_dim=heads * head_dim * transformer.get("mlp_ratio", 3),
        mlp_matrices=3,  # SwiGLU
        out_channels=transformer.get("out_channels") or transformer["in_channels"],
        defaults=dict(defaults),
        path=path,
        media_inputs=("image",),
        joins_image_tokens=True,
        keeps_prefix_kv=bool(transformer.get("causal_condition", True)),  # diffusers' default: True
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer({"transformer_blocks": transformer["num_layers"]}),
    )


def input_size(image_size: tuple[int, int], output_resolution: int) -> tuple[int, int]:
    """(width, height) the pipeline resizes a condition image of `image_size` to: `output_resolution`^2 pixels at
    its aspect ratio, each side rounded to a multiple of 32 (its `calculate_dimensions`)."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

    width, height, _ = calculate_dimensions(output_resolution * output_resolution, image_size[0] / image_size[1])
    if not width or not height:
        raise ValueError(f"a condition image of {image_size[0]}x{image_size[1]} resized to {output_resolution}^2 "
                         "pixels at its aspect ratio has a side under 16 pixels; crop it to a less extreme aspect "
                         "ratio")
    return width, height


def _output_resolution(job: JobSpec) -> int:
    from genbatch.models.resolve import resolve_model

    return int(resolve_model(job.model).defaults.get("output_resolution", CALL_DEFAULTS["output_resolution"]))


def _condition(pipe, job: JobSpec):
    """The row's condition image as the pipeline prepares it: (the resized RGBA image the text encoder reads, the
    (1, 4, 1, h, w) pixels the VAE encodes, (width, height)); None without an image."""
    if "image" not in job.media:
        return None
    image = job.media["image"].image
    if image.mode != "RGBA":
        image = image.convert("RGBA")
    width, height = input_size(image.size, _output_resolution(job))
    resized = pipe.image_processor.resize(image, width=width, height=height)
    pixels = pipe.image_processor.preprocess(image, width=width, height=height).unsqueeze(2)
    return resized, pixels, (width, height)


class QwenImage21Hooks(FamilyHooks):
    """Qwen-Image 2.1: true CFG above scale 1 with a negative prompt; one key/value cache per guidance branch and
    sequence layout, filled at the first step."""

    name = "qwen-image-21"
    per_row_shared = ("img_shapes", "image_latents")

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        condition = _condition(pipe, job)
        images = None if condition is None else [condition[0]]
        use_cfg = job.guidance_scale > 1.0 and job.negative_prompt is not None
        texts = {COND: job.prompt, **({UNCOND: job.negative_prompt} if use_cfg else {})}
        branches = {}
        for branch, text in texts.items():
            # (1, n, d) and (1, n) text-and-image embeddings: one prompt is never padded, so its mask is None
            embeds, mask, image_pad_mask = pipe.encode_prompt(prompt=text, image=images, device=device)
            branches[branch] = {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask,
                                "img_mask": image_pad_mask, "kv_branch": branch}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def batch_conditioning(self, rows: list[Conditioning]) -> Conditioning:
        """The rows' encodes kept apart, one list entry each: the transformer takes one sequence layout per forward,
        so `predict` groups the rows that share one."""
        if len(rows) == 1:
            return super().batch_conditioning(rows)
        self._check_branches(rows)
        branches = {name: {key: value if key == "kv_branch" else [row.branches[name][key] for row in rows]
                           for key, value in kwargs.items()}
                    for name, kwargs in rows[0].branches.items()}
        return Conditioning(branches=branches, guidance_scale=rows[0].guidance_scale)

    @staticmethod
    def _check_branches(rows: list[Conditioning]) -> None:
        from genbatch.models.hooks import batch_conditioning

        batch_conditioning([Conditioning(branches={name: {} for name in row.branches}, guidance_scale=0.0)
                            for row in rows])  # the rows must run the same branches (it names the fix)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import numpy as np
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift, retrieve_timesteps

        _rebuild_rotary_tables(pipe.transformer)
        condition = _condition(pipe, job)
        # the noise (1, H/16 * W/16, c) and the condition image's tokens (1, h/16 * w/16, c), in the prompt
        # embeddings' dtype (the text encoder's), as the pipeline draws and encodes them
        latents, image_latents = pipe.prepare_latents(None if condition is None else [condition[1]], 1,
                                                      pipe.transformer.config.in_channels, job.height, job.width,
                                                      pipe.text_encoder.dtype, device, generator)
        shapes = [] if condition is None else [(1, condition[2][1] // VAE_SCALE, condition[2][0] // VAE_SCALE)]
        img_shapes = [[*shapes, (1, job.height // VAE_SCALE, job.width // VAE_SCALE)]]
        grid = pipe.config.sample_sigmas
        if grid is not None and len(grid) != job.num_inference_steps:
            raise ValueError(f"model {job.model} samples on the {len(grid)}-step sigma grid its model_index.json "
                             f"configures (sample_sigmas), and job {job.id} asks for {job.num_inference_steps} "
                             f"steps; set num_inference_steps to {len(grid)} (or leave it empty)")
        steps = job.num_inference_steps
        sigmas = grid if grid is not None else np.linspace(1.0, 1 / steps, steps)
        config = pipe.scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                             config.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps,
                          shared={"img_shapes": img_shapes, "image_latents": [image_latents], "kv_caches": {}})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        out = torch.empty_like(latents)
        for rows, inputs in _layout_groups(branch, trajectory, latents.shape[1]):
            out[rows] = self._forward(pipe, trajectory, latents[rows], t, step, branch["kv_branch"], rows, inputs)
        return out

    @staticmethod
    def _forward(pipe, trajectory: Trajectory, latents, t, step: int, name: str, rows: list[int], inputs: dict):
        """One transformer forward of rows sharing a layout, as the pipeline's: the first step fills the branch's
        key/value cache; a later step reads it (filling it first when the job resumed past the first step)."""
        import torch
        from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

        transformer = pipe.transformer
        image_latents = [trajectory.shared["image_latents"][row] for row in rows]
        hidden = latents
        if image_latents[0] is not None:
            # (k, m, c) + (k, n, c) -> (k, m + n, c): the condition image's tokens first, as the pipeline's
            hidden = torch.cat([torch.cat(image_latents, dim=0).to(latents.dtype), latents], dim=1)
        call = dict(hidden_states=hidden, timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                    img_shapes=[trajectory.shared["img_shapes"][row] for row in rows], attention_kwargs={},
                    return_dict=False, **inputs)
        cache, mode = None, None
        if transformer.config.causal_condition:  # the pipeline's use_kv_cache=True
            key = (name, tuple(rows))
            cache = trajectory.shared["kv_caches"].get(key)
            if cache is None:
                cache = trajectory.shared["kv_caches"][key] = QwenImage21KVCache(len(transformer.transformer_blocks))
                if step > 0:  # a resumed job: the prefix's keys and values, from the same tokens as at step 0
                    transformer(kv_cache=cache, kv_cache_mode="extract", **call)
            mode = "extract" if step == 0 else "cached"
        prediction = transformer(kv_cache=cache, kv_cache_mode=mode, **call)[0]
        return prediction[:, -latents.shape[1]:]  # (k, m + n, c) -> the output's (k, n, c)

    def combine(self, predictions, guidance_scale: float, t):
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents):
        import torch

        # (b, h/16 * w/16, c) -> (b, c, 1, h/16, w/16): one frame for the video-shaped VAE
        latents = pipe._unpack_latents(latents, job.height, job.width, VAE_SCALE).to(pipe.vae.dtype)
        config = pipe.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        return (latents * std + mean).to(next(pipe.vae.parameters()).device)

    def postprocess(self, pipe, decoded):
        # (1, 4, 1, h, w) -> its one frame (1, 4, h, w) -> (h, w, 4) in [0, 1] -> RGB
        return pipe.image_processor.postprocess(decoded[:, :, 0], output_type="np")[0][..., :3]


def _prefix_length(block_inputs: Mapping[str, Any]) -> int:
    """How many of a block's hidden states are the prefix: the end of its last block-causal segment at the first
    step (or without the cache); 0 on a cached step, whose hidden states are the output's alone."""
    segments = block_inputs.get("segments")
    return segments[-1][1] if segments else 0


def _rebuild_rotary_tables(transformer) -> None:
    """Compute the rotary tables again where loading left them on the meta device: `QwenImage21Rope` keeps them in a
    plain list (neither parameters nor buffers), which a transformer built on the meta device (--fsdp, --tp) gets
    as shapes only. They are a function of the config alone (the class's own constructor computes them)."""
    rope = transformer.pos_embed
    if any(table.is_meta for table in rope.freqs):
        import torch

        with torch.device("cpu"):
            rope.freqs = type(rope)(theta=rope.theta, axes_dim=rope.axes_dim).freqs


def _layout_groups(branch: Mapping[str, Any], trajectory: Trajectory, target_tokens: int):
    """(rows, transformer inputs) for each group of a branch's rows that share a sequence layout (the same prompt
    embedding length, the same vision slots and condition grid), in the order of their first row. One row's
    encode holds tensors, a batch's lists of them (`batch_conditioning`)."""
    import torch

    def listed(value):
        return value if isinstance(value, list) else [value]

    embeds, masks, slots = (listed(branch[key]) for key in ("encoder_hidden_states", "encoder_hidden_states_mask",
                                                              "img_mask"))
    groups: dict[tuple, list[int]] = {}
    for row, (embed, slot) in enumerate(zip(embeds, slots, strict=True)):
        shapes = tuple(trajectory.shared["img_shapes"][row])
        groups.setdefault((embed.shape[1], tuple(slot[0].tolist()), shapes), []).append(row)
    for rows in groups.values():
        mask = None
        if any(masks[row] is not None for row in rows):  # (k, n): every row's, ones for a row without one
            mask = torch.cat([masks[row] if masks[row] is not None else
                              torch.ones(embeds[row].shape[:2], dtype=torch.long, device=embeds[row].device)
                              for row in rows])
        slot = torch.cat([slots[row] for row in rows])  # (k, n_vlm) bool
        # the output's tokens after the prompt's: one slot per 2 x 2 of them, (k, n_vlm) -> (k, n_vlm + n / 4)
        slot = torch.cat([slot, slot.new_ones(slot.shape[0], target_tokens // 4)], dim=1)
        yield rows, {"encoder_hidden_states": torch.cat([embeds[row] for row in rows]),
                     "encoder_hidden_states_mask": mask, "img_mask": slot}


def processor_class():
    """`transformers.Qwen3VLProcessor` where torchvision is installed; without it (its video processor needs it) the
    same class without the video processor (`Qwen3VLImageTextProcessor`, this module's), which takes images and
    text and processes them as Qwen3VLProcessor does."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        from transformers import Qwen3VLProcessor

        return Qwen3VLProcessor
    return _image_text_processor()


_CLASSES: dict[str, type] = {}


def _image_text_processor() -> type:
    if "processor" not in _CLASSES:
        from transformers import Qwen3VLProcessor
        from transformers.processing_utils import ProcessorMixin

        class Qwen3VLImageTextProcessor(Qwen3VLProcessor):
            """Qwen3VLProcessor without its video processor (which needs torchvision)."""

            def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
                self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"  # Qwen3VLProcessor's defaults
                self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
                self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
                ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
                self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
                self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
                self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)

        Qwen3VLImageTextProcessor.__module__ = __name__  # a saved directory names it, and diffusers finds it here
        _CLASSES["processor"] = Qwen3VLImageTextProcessor
    return _CLASSES["processor"]


def __getattr__(name: str):
    """`Qwen3VLImageTextProcessor`, built on first use: a saved tiny preset's model_index.json names it by this module,
    where diffusers' loader looks it up, and its base class `ProcessorMixin`, which tells the loader how to load it."""
    if name == "Qwen3VLImageTextProcessor":
        return _image_text_processor()
    if name == "ProcessorMixin":
        from transformers.processing_utils import ProcessorMixin

        return ProcessorMixin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tiny_tokenizer():
    """A tokenizer of the pipeline's prompt templates (`genbatch.models.prompt_tokenizer`): their `<|...|>` markers
    single special tokens, with Qwen3-VL's chat template."""
    from genbatch.models.prompt_tokenizer import _pieces, template_tokenizer

    head = (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
            "<image1><|vision_start|><|image_pad|><|vision_end|> <image2>")
    tokenizer = template_tokenizer(head + "{}<|im_end|>\n<|im_start|>assistant\n<|video_pad|>", len(_pieces(head)),
                                   1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny(meta: frozenset[str] = frozenset()):
    """Qwen-Image 2.1: QwenImage21Transformer2DModel (`TINY_TRANSFORMER`), AutoencoderKLQwenImage21 (`TINY_VAE`), a
    two-layer Qwen3-VL with a one-block vision tower, its processor, and flow-match Euler as published."""
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Pipeline,
        QwenImage21Transformer2DModel,
    )
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from genbatch.models.tiny import seeded

    tokenizer = tiny_tokenizer()
    processor = processor_class()(image_processor=Qwen2VLImageProcessorPil(**TINY_PROCESSOR), tokenizer=tokenizer,
                                  chat_template=CHAT_TEMPLATE)
    ids = {name: tokenizer.convert_tokens_to_ids(f"<|{marker}|>") for name, marker in
           (("image_token_id", "image_pad"), ("video_token_id", "video_pad"),
            ("vision_start_token_id", "vision_start"), ("vision_end_token_id", "vision_end"))}
    config = Qwen3VLConfig(text_config={**TINY_TEXT, "vocab_size": len(tokenizer)}, vision_config=TINY_VISION,
                           tie_word_embeddings=False, **ids)
    text_encoder = seeded(0, lambda: Qwen3VLForConditionalGeneration(config), "text_encoder", meta)
    transformer = seeded(1, lambda: _scaled(QwenImage21Transformer2DModel(**TINY_TRANSFORMER)), "transformer", meta)
    vae = seeded(2, lambda: AutoencoderKLQwenImage21(**TINY_VAE))
    scheduler = FlowMatchEulerDiscreteScheduler(**TINY_SCHEDULER)
    return QwenImage21Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, processor=processor,
                               transformer=transformer)


SCALED = ("norm_q", "norm_k", "modulation", "attn.to_v")
"""The tiny transformer's weights made 3x larger: its q/k norm gains (sharper attention), the shared modulation
(larger gates) and the values, so that the prompt, the condition image and the guidance visibly reach the image (with
the default initialisation two prompts differ by about one level of 255)."""


def _scaled(transformer):
    """The random transformer with the `SCALED` weights 3x larger; deterministic, on any device but meta."""
    import torch

    with torch.no_grad():
        for name, weight in transformer.named_parameters():
            if weight.device.type != "meta" and any(part in name for part in SCALED):
                weight.mul_(3.0)
    return transformer


TENSOR_SPLITS = TensorSplits(
    from_diffusers=True,  # its _tp_plan: q, k, v and the SwiGLU's proj and gate column-wise, to_out and out row-wise
    styles={"transformer_blocks.*.attn": HEADS,  # the processor takes its head size as inner_dim // heads
            "modulation.1": GATHERED_COLWISE},  # the one modulation every block reads its scales and gates from
    all_reduces={"transformer_blocks": 2},  # the attention's output projection and the SwiGLU's
)
"""Qwen-Image 2.1's tensor splits: diffusers' `_tp_plan`, the shared modulation sharded too."""

FAMILY = ModelFamily(
    name="qwen-image-21",
    pipelines=("QwenImage21Pipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=QwenImage21Hooks(),
    transformers={
        "QwenImage21Transformer2DModel": TransformerParts(
            blocks=Blocks(before=("img_in", "txt_in", "pos_embed", "time_text_embed", "modulation"),
                          repeated=("transformer_blocks",), after=("norm_out", "proj_out")),
            # one block-causal attention over [text and condition image, output image]: causal and padding masks
            attention=(AttentionSite(pattern="transformer_blocks.*.attn", kind=JOINT, streams=("hidden_states",),
                                     masked=True),),
            sequence=SequenceSplits(kept_prefix=KeptPrefix(
                blocks="transformer_blocks", token_inputs=("rotary_emb", "target_token_mask"),
                prefix_length=_prefix_length)),
            tensor_splits=TENSOR_SPLITS,
            compile_units=("transformer_blocks.*",),  # diffusers' _repeated_blocks: QwenImage21TransformerBlock
        ),
    },
    text_encoders={"Qwen3VLForConditionalGeneration": VL_ENCODER_BLOCKS},
    text_encoder_splits={"Qwen3VLForConditionalGeneration": VL_ENCODER_SPLITS},
    vae_classes=("diffusers:AutoencoderKLQwenImage21",),
    vae_rules=vae_rules.AUTOENCODER_KL_QWEN_IMAGE_21,
    presets=(TinyPreset(name="tiny-qwen-image-21", transformer=TINY_TRANSFORMER, vae=TINY_VAE, defaults=TINY_DEFAULTS,
                        build=build_tiny),),
    image_encode=ImageEncode(video=False, area=1024 * 1024, multiple=32, required=False),
    vae_costs=vae_costs.QWEN_IMAGE_21_VAE,
    published=(
        Published(name="qwen-image-2.1", hub_id="Qwen/Qwen-Image-2.1", transformer=PUBLISHED_TRANSFORMER,
                  vae=PUBLISHED_VAE, parameters=7.12e9, text_encoder_parameters=8.77e9,  # Qwen3-VL-8B
                  vae_parameters=0.338e9,
                  spec_facts={"uses_cfg": False}),  # sampled without guidance by default (true_cfg_scale 1)
    ),
)
