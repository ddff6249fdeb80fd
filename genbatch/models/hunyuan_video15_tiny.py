"""The tiny HunyuanVideo 1.5 presets (`tiny-hunyuan-video-15`, `tiny-hunyuan-video-15-i2v`): the real diffusers and
transformers classes with small configs and seeded random weights, built in memory (no files, no downloads).

- `HunyuanVideo15Transformer3DModel`: 2 dual-stream blocks of 2 heads x 8 (the heads split over ulysses or tp 2),
  patch 1, the 9 input channels of the pipeline's [noise, image latents, mask] (4 + 4 + 1).
- `AutoencoderKLHunyuanVideo15`: 8 channels a stage, 8x spatial and 4x temporal compression (the published one
  is 16x; the rules of its layers are the same), 4 latent channels.
- `Qwen2_5_VLTextModel`: 3 layers, so that the pipeline's `hidden_states[-3]` is the first layer's output; its
  tokenizer reads the pipeline's chat template (`genbatch.models.prompt_tokenizer`), the system prompt exactly
  the 108 tokens the pipeline crops, and carries Qwen2's chat template for `apply_chat_template`.
- ByT5 (`T5EncoderModel`, gated GELU as ByT5's) with ByT5's own byte tokenizer (it needs no vocabulary file), for
  the prompt's quoted text.
- I2V: `SiglipVisionModel` (16 patch tokens) with its PIL image processor (the default one needs torchvision).

With default initialisation the prompt barely reaches the video (a few levels apart between two prompts), so
`scale_for_tests` scales a few weights deterministically (the text refiner's input projection, the glyph and
image projections, the blocks' query and text-key norm gains and text values) before the pipeline is returned:
the prompt, its quoted text, the image and the guidance scale each move the frames by tens of levels.
"""

from __future__ import annotations

from genbatch.models.tiny import seeded, t5_config

LATENT_CHANNELS = 4
TINY_TRANSFORMER = dict(in_channels=2 * LATENT_CHANNELS + 1, out_channels=LATENT_CHANNELS, num_attention_heads=2,
                        attention_head_dim=8, num_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1,
                        patch_size_t=1, text_embed_dim=32, text_embed_2_dim=32, image_embed_dim=16,
                        rope_axes_dim=(2, 2, 4), target_size=64, task_type="t2v")
"""The tiny transformer; `target_size` 64: the pipeline's default size is the 16:9 bucket of 64^2 pixels, 80 x 48."""
TINY_I2V_TRANSFORMER = dict(TINY_TRANSFORMER, task_type="i2v")
TINY_VAE = dict(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, block_out_channels=(8, 8, 8, 8),
                layers_per_block=1, spatial_compression_ratio=8, temporal_compression_ratio=4, scaling_factor=1.03682)
"""Three spatial (two of them temporal too) downsamplings: 8x in space, 4x in time, the mid-block attention kept."""
TINY_DEFAULTS = {"width": 80, "height": 48, "num_frames": 9, "num_inference_steps": 4, "guidance_scale": 6.0,
                 "fps": 24}
TINY_TEXT_ENCODER = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, rope_theta=1000000.0,
                         rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"})
"""A three-layer Qwen2.5-VL language model (its rotary sections add up to half its head size, 8)."""
TINY_VISION = dict(hidden_size=16, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                   patch_size=8)
"""A two-layer SigLIP vision tower: 4 x 4 patches of a 32 x 32 image, 16 image tokens."""
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Qwen2's chat template (for text messages), which the pipeline's `apply_chat_template` renders."""


def chat_tokenizer():
    """A tokenizer of the pipeline's chat template: the system prompt and its markers exactly the 108 tokens the
    pipeline crops (`prompt_template_encode_start_idx`), the prompt after them, padded to 1000 + 108."""
    from diffusers import HunyuanVideo15Pipeline
    from jinja2 import Template

    from genbatch.models.prompt_tokenizer import template_tokenizer

    # the system prompt, the crop and the prompt's length as `_get_mllm_prompt_embeds`'s defaults give them (the
    # values `__init__` sets too)
    length, _, system, crop = HunyuanVideo15Pipeline._get_mllm_prompt_embeds.__defaults__
    marker = "\x00prompt\x00"
    rendered = Template(CHAT_TEMPLATE).render(
        messages=[{"role": "system", "content": system}, {"role": "user", "content": marker}],
        add_generation_prompt=True)
    tokenizer = template_tokenizer(rendered.replace(marker, "{}"), crop, length + crop)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def scale_for_tests(transformer) -> None:
    """Scale a few weights so that the prompt, its quoted text, the image and the guidance visibly move the
    frames (deterministic: the same weights every build)."""
    import torch

    with torch.no_grad():
        transformer.context_embedder.proj_in.weight.mul_(8.0)  # the Qwen text into the token refiner
        transformer.context_embedder_2.linear_3.weight.mul_(8.0)  # the glyph (ByT5) text projection
        transformer.image_embedder.linear_2.weight.mul_(8.0)  # the SigLIP image projection
        for block in transformer.transformer_blocks:
            # the video's queries and the text's keys (their QK-norm gains): the video attends to the text
            block.attn.norm_q.weight.mul_(3.0)
            block.attn.norm_added_k.weight.mul_(4.0)
            block.attn.add_v_proj.weight.mul_(4.0)  # what the video reads from the text tokens


def components(meta: frozenset[str], transformer_config: dict) -> dict:
    """Every tiny component of a HunyuanVideo 1.5 pipeline but the I2V image encoder."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    tokenizer = chat_tokenizer()
    text_config = Qwen2_5_VLTextConfig(**TINY_TEXT_ENCODER, vocab_size=len(tokenizer), pad_token_id=0,
                                       bos_token_id=None, eos_token_id=1)
    text_encoder = seeded(0, lambda: Qwen2_5_VLTextModel(text_config), "text_encoder", meta)
    tokenizer_2 = ByT5Tokenizer()
    byt5 = T5Config(**{**t5_config(len(tokenizer_2)), "feed_forward_proj": "gated-gelu"})
    text_encoder_2 = seeded(1, lambda: T5EncoderModel(byt5), "text_encoder_2", meta)
    transformer = seeded(2, lambda: HunyuanVideo15Transformer3DModel(**transformer_config), "transformer", meta)
    if "transformer" not in meta:
        scale_for_tests(transformer)
    vae = seeded(3, lambda: AutoencoderKLHunyuanVideo15(**TINY_VAE))
    return dict(text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                tokenizer_2=tokenizer_2, transformer=transformer, vae=vae,
                scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                guider=ClassifierFreeGuidance(guidance_scale=TINY_DEFAULTS["guidance_scale"]))


def build_tiny(meta: frozenset[str] = frozenset()):
    """HunyuanVideo 1.5 text-to-video (`HunyuanVideo15Pipeline`, true CFG through its guider)."""
    from diffusers import HunyuanVideo15Pipeline

    return HunyuanVideo15Pipeline(**components(meta, TINY_TRANSFORMER))


def build_tiny_i2v(meta: frozenset[str] = frozenset()):
    """HunyuanVideo 1.5 image-to-video (`HunyuanVideo15ImageToVideoPipeline`): the text-to-video components with
    an I2V transformer, and a SigLIP vision tower with its PIL image processor."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    image_encoder = seeded(4, lambda: SiglipVisionModel(SiglipVisionConfig(**TINY_VISION)))
    size = TINY_VISION["image_size"]
    processor = SiglipImageProcessorPil(size={"height": size, "width": size})
    return HunyuanVideo15ImageToVideoPipeline(**components(meta, TINY_I2V_TRANSFORMER), image_encoder=image_encoder,
                                              feature_extractor=processor)


__all__ = ["TINY_DEFAULTS", "TINY_I2V_TRANSFORMER", "TINY_TRANSFORMER", "TINY_VAE", "build_tiny", "build_tiny_i2v"]
