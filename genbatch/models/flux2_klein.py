"""FLUX.2 [klein] (`diffusers.Flux2KleinPipeline`): everything genbatch knows about the family beyond FLUX.2
[dev]'s own (`genbatch.models.flux2`).

The hooks reproduce `Flux2KleinPipeline.__call__` exactly. What differs from [dev]:
- **The prompt.** A `Qwen3ForCausalLM` text encoder: the prompt as one user turn of Qwen3's chat template with the
  generation prompt and `enable_thinking=False`, padded to 512 tokens; hidden states 9, 18 and 27 stacked.
- **No guidance embedding.** The transformer has none; the step-distilled models (`is_distilled=True` in the
  pipeline's config: FLUX.2-klein-4B and -9B) run one branch a step and ignore `guidance_scale`. The base models
  (`is_distilled=False`: FLUX.2-klein-base-4B and -9B) run classifier-free guidance when `guidance_scale > 1`,
  against the empty prompt (the pipeline takes no negative prompt, so a row's `negative_prompt` is ignored):
  `uncond + scale * (cond - uncond)`, the branches split over `--cfg 2`.

A directory's `model_index.json` says which it is (no `is_distilled`: the pipeline's default, a base model); so
does each preset (`tiny-flux2-klein` distilled, `tiny-flux2-klein-base` not). The reference image, the schedule,
the VAE and every parallel method's parts are [dev]'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import flux2, flux2_tiny
from genbatch.models.base import Blocks, TinyPreset, decoder_tensor_splits
from genbatch.models.hooks import COND, UNCOND, Conditioning, classifier_free_guidance
from genbatch.models.spec import ModelSpec

TEXT_LAYERS = (9, 18, 27)
"""The Qwen3 hidden states `Flux2KleinPipeline` stacks (its `text_encoder_out_layers` default)."""
CALL_DEFAULTS = dict(flux2.CALL_DEFAULTS)
"""`Flux2KleinPipeline.__call__`'s defaults: [dev]'s (50 steps, guidance 4, ignored by a distilled model)."""
PRESET_DISTILLED = {"tiny-flux2-klein": True, "tiny-flux2-klein-base": False}
"""Whether each preset is step-distilled (its pipeline's `is_distilled`)."""


def is_distilled(name: str, path: str | None) -> bool:
    """A directory's `is_distilled` (its model_index.json; absent: False, the pipeline's default), or a preset's."""
    if path is None:
        return PRESET_DISTILLED.get(name, False)
    with open(os.path.join(path, "model_index.json"), encoding="utf-8") as handle:
        return bool(json.load(handle).get("is_distilled", False))


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """[dev]'s spec; two branches a step (CFG) for a base model."""
    if defaults is None:
        spatial = 2 ** (len(vae["block_out_channels"]) - 1)
        defaults = {**CALL_DEFAULTS, "width": flux2.SAMPLE_SIZE * spatial, "height": flux2.SAMPLE_SIZE * spatial}
    return flux2.flux2_spec(name, "flux2-klein", transformer, vae, defaults, path,
                            uses_cfg=not is_distilled(name, path))


class Flux2KleinHooks(flux2.Flux2Hooks):
    """FLUX.2 [klein]: no guidance input; a base model's CFG against the empty prompt."""

    name = "flux2-klein"
    text_layers = TEXT_LAYERS
    per_row_shared = ("image_latents",)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        branches = {COND: self.prompt_branch(pipe, job.prompt, device)}
        if job.guidance_scale > 1.0 and not pipe.config.is_distilled:  # the pipeline's do_classifier_free_guidance
            branches[UNCOND] = self.prompt_branch(pipe, "", device)
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    @staticmethod
    def guidance(pipe, job: JobSpec, latents, device):
        return None

    def combine(self, predictions, guidance_scale: float, t):
        return classifier_free_guidance(predictions, guidance_scale)


QWEN3 = Blocks(before=("model.embed_tokens",), repeated=("model.layers",), after=("model.norm", "lm_head"))
"""`Qwen3ForCausalLM`."""

# diffusers' scripts/convert_flux2_to_diffusers.py (klein-4b, klein-9b); the base models share them
PUBLISHED_TRANSFORMER_4B = dict(flux2.PUBLISHED_TRANSFORMER, num_layers=5, num_single_layers=20,
                                num_attention_heads=24, joint_attention_dim=7680, guidance_embeds=False)
PUBLISHED_TRANSFORMER_9B = dict(flux2.PUBLISHED_TRANSFORMER, num_layers=8, num_single_layers=24,
                                num_attention_heads=32, joint_attention_dim=12288, guidance_embeds=False)
PUBLISHED_TEXT_ENCODER_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True)
"""Qwen/Qwen3-4B: 4.02B parameters; 2560 wide, so `--text-encoder-parallel auto` keeps it whole (or FSDP)."""
PUBLISHED_TEXT_ENCODER_9B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=False)
"""Qwen/Qwen3-8B: 8.19B parameters, 6.95B of them in its 36 layers, which `auto` splits over a job group."""
PUBLISHED_CONFIG = {
    "4b": {"transformer": PUBLISHED_TRANSFORMER_4B, "vae": flux2.PUBLISHED_VAE,
           "text_encoder": PUBLISHED_TEXT_ENCODER_4B},
    "9b": {"transformer": PUBLISHED_TRANSFORMER_9B, "vae": flux2.PUBLISHED_VAE,
           "text_encoder": PUBLISHED_TEXT_ENCODER_9B},
}
"""FLUX.2 [klein]'s published configs by size; the distilled and base models of a size share them."""
_4B = dict(parameters=3.876e9, text_encoder=4.02e9, text_encoder_split=0.0)
_9B = dict(parameters=9.079e9, text_encoder=8.19e9, text_encoder_split=6.95e9)

FAMILY = replace(
    flux2.FAMILY,
    name="flux2-klein",
    pipelines=("Flux2KleinPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=Flux2KleinHooks(),
    text_encoders={"Qwen3ForCausalLM": QWEN3},
    text_encoder_splits={"Qwen3ForCausalLM": decoder_tensor_splits("model.layers")},
    presets=(
        TinyPreset(name="tiny-flux2-klein", transformer=flux2_tiny.TINY_KLEIN_TRANSFORMER, vae=flux2_tiny.TINY_VAE,
                   defaults=flux2_tiny.DEFAULTS["tiny-flux2-klein"], build=flux2_tiny.build_klein),
        TinyPreset(name="tiny-flux2-klein-base", transformer=flux2_tiny.TINY_KLEIN_TRANSFORMER,
                   vae=flux2_tiny.TINY_VAE, defaults=flux2_tiny.DEFAULTS["tiny-flux2-klein-base"],
                   build=flux2_tiny.build_klein_base),
    ),
    # the distilled models at the 4 steps their model cards give; the base models at the pipeline's 50, with CFG
    published=(
        flux2.published("flux.2-klein", "black-forest-labs/FLUX.2-klein-4B", PUBLISHED_TRANSFORMER_4B, steps=4,
                        distilled=True, **_4B),
        flux2.published("flux.2-klein-9b", "black-forest-labs/FLUX.2-klein-9B", PUBLISHED_TRANSFORMER_9B, steps=4,
                        distilled=True, **_9B),
        flux2.published("flux.2-klein-base", "black-forest-labs/FLUX.2-klein-base-4B", PUBLISHED_TRANSFORMER_4B,
                        steps=50, **_4B),
        flux2.published("flux.2-klein-base-9b", "black-forest-labs/FLUX.2-klein-base-9B", PUBLISHED_TRANSFORMER_9B,
                        steps=50, **_9B),
    ),
)
