"""The tiny FLUX.2 presets (`tiny-flux2`, `tiny-flux2-klein`, `tiny-flux2-klein-base`): the real diffusers and
transformers classes with small configs and seeded random weights, and in-memory tokenizers carrying the chat
templates the pipelines apply.

- **Tokenizers.** `Flux2Pipeline` wraps the prompt in a Mistral chat (its system message, then the prompt) and
  pads it to 512 tokens; `Flux2KleinPipeline` in Qwen3's (a user turn and the assistant's empty thinking block,
  `enable_thinking=False`). A one-token-per-character tokenizer would spend the 512 tokens on the system message
  and truncate the prompt away, so these tokenizers hold the template's words and markers as whole tokens and
  spell any other word out a character at a time (WordPiece continuation pieces): distinct prompts give distinct
  ids. They save and reload with their chat template like any fast tokenizer.
- **Text encoders.** `Mistral3ForConditionalGeneration` of 30 layers (the pipeline stacks hidden states 10, 20
  and 30) with a one-layer Pixtral vision tower that idles on text, and `Qwen3ForCausalLM` of 27 layers (9, 18,
  27); both 16 wide, so the transformer's text input is 3 x 16 = 48 wide.
- **Weights that show.** With default initialisation the prompt barely reaches the image: the transformer's
  LayerNorms and QK RMSNorms make the text's scale irrelevant, and its modulation gates are small. So the
  modulation projections and the QK norms' gains are scaled up, deterministically (`GAINS`), and two prompts give
  visibly different images (as do two guidance values).
- **The VAE** (`AutoencoderKLFlux2`, 8x spatial, 4 latent channels: 16 per 2x2 token) has random batch-norm
  statistics, so a decode that skipped the pipeline's (un)normalisation would not match it.

Every builder imports torch when called, never at import.
"""

from __future__ import annotations

import re
import string
from typing import Any

TINY_TRANSFORMER: dict[str, Any] = dict(
    patch_size=1,
    in_channels=16,  # 4 latent channels x the 2 x 2 patch the pipeline packs into a token
    num_layers=1,
    num_single_layers=2,  # PipeFusion 2 cuts inside the single-stream list; a step cache spans 2 blocks
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=48,  # 3 stacked hidden states of a 16-wide text encoder
    timestep_guidance_channels=64,
    mlp_ratio=3.0,
    axes_dims_rope=(4, 4, 4, 4),
    rope_theta=2000,
    eps=1e-6,
    guidance_embeds=True,
)
"""FLUX.2 [dev]'s transformer: one dual- and two single-stream blocks, 4 heads x 16, guidance embedding."""
TINY_KLEIN_TRANSFORMER: dict[str, Any] = dict(TINY_TRANSFORMER, num_layers=2, guidance_embeds=False)
"""FLUX.2 [klein]'s: two dual-stream blocks (PipeFusion 2 cuts between the lists), no guidance embedding."""
TINY_VAE: dict[str, Any] = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[8, 8, 8, 8],
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=64,
    use_quant_conv=True,
    use_post_quant_conv=True,
)
"""`AutoencoderKLFlux2`'s layout (quant convs, mid-block attention, batch norm over the 2 x 2 patched latent) at
8 channels: 8 pixels a latent pixel, as the published one."""
TINY_MISTRAL = dict(model_type="mistral", hidden_size=16, intermediate_size=32, num_hidden_layers=30,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=1024,
                    initializer_range=0.5)
"""The language model of the tiny Mistral 3: 30 layers (the pipeline reads hidden states 10, 20 and 30)."""
TINY_PIXTRAL = dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, head_dim=8, image_size=64, patch_size=16)
TINY_QWEN3 = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=27, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=4, max_position_embeddings=1024, tie_word_embeddings=True,
                  initializer_range=0.5)
"""A 27-layer Qwen3 (the pipeline reads hidden states 9, 18 and 27)."""
GAINS = {"stream_modulation": 3.0, "norm_out.linear": 3.0, "norm_q": 3.0, "norm_k": 3.0, "norm_added_q": 3.0,
         "norm_added_k": 3.0}
"""Transformer parameter name part -> what those parameters are multiplied by: the AdaLN modulations (their gates
reach the residual streams) and the QK norms' gains (sharper attention, so the text's content counts). The
timestep embedding is left as drawn: scaled up, it would swamp the K/V's change between steps, which the
stale-K/V methods (PipeFusion, DistriFusion) rely on being small."""
DEFAULTS = {
    "tiny-flux2": {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 4.0},
    # distilled: the guidance scale is ignored (1: no warning from the pipeline)
    "tiny-flux2-klein": {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 1.0},
    "tiny-flux2-klein-base": {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 4.0},
}
"""The presets' per-job defaults: small enough to run in a second on a CPU."""

MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set text = message['content'] if message['content'] is string"
    " else message['content'] | map(attribute='text') | join('') %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
"""Mistral Small 3's chat format for a system message and user turns whose content is a list of text parts (as
`Flux2Pipeline`'s `format_input` builds them)."""
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""Qwen3's chat format for user turns, the generation prompt, and the empty thinking block `enable_thinking=False`
adds."""
_WORD = re.compile(r"\w+|[^\w\s]")  # what the BERT pre-tokenizer splits text into
_CHARACTERS = string.ascii_letters + string.digits + string.punctuation


def chat_tokenizer(words: str, markers: tuple[str, ...], chat_template: str, *, bos: str | None = None):
    """A WordPiece tokenizer whose vocabulary is every character (alone and as a continuation), the words of
    `words` whole, and `markers` as special tokens; `chat_template` is its chat template. Built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    whole = [word for word in dict.fromkeys(_WORD.findall(words)) if len(word) > 1]
    vocabulary = ["<pad>", "</s>", "<unk>", *([bos] if bos else []), *_CHARACTERS,
                  *(f"##{c}" for c in _CHARACTERS), *whole]
    core = Tokenizer(models.WordPiece(vocab={token: i for i, token in enumerate(vocabulary)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                        bos_token=bos, additional_special_tokens=list(markers), model_max_length=512)
    tokenizer.chat_template = chat_template
    return tokenizer


def mistral_tokenizer():
    """The tokenizer of the tiny [dev]: its chat template, the system message's words whole."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    return chat_tokenizer(SYSTEM_MESSAGE, ("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]"),
                          MISTRAL_CHAT_TEMPLATE, bos="<s>")


def qwen3_tokenizer():
    """The tokenizer of the tiny [klein]: Qwen3's chat template, its role names whole."""
    return chat_tokenizer("user assistant", ("<|im_start|>", "<|im_end|>", "<think>", "</think>"),
                          QWEN3_CHAT_TEMPLATE)


def _special_ids(tokenizer) -> dict[str, int | None]:
    return dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)


def _shared(transformer_config: dict, meta: frozenset[str], seed: int) -> dict:
    """The transformer (scaled by `GAINS`), the VAE (random batch-norm statistics) and
    the flow-match Euler scheduler FLUX.2's pipelines ship (FLUX.1-dev's settings; the pipelines pass their own
    shift `mu`)."""
    import torch
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

    from genbatch.models.tiny import placed

    torch.manual_seed(seed)
    with placed("transformer", meta):
        transformer = Flux2Transformer2DModel(**transformer_config).eval()
    if "transformer" not in meta:
        with torch.no_grad():
            for name, param in transformer.named_parameters():
                gain = next((value for part, value in GAINS.items() if part in name), None)
                if gain is not None:
                    param.mul_(gain)
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLFlux2(**TINY_VAE).eval()
    generator = torch.Generator().manual_seed(seed + 2)
    channels = vae.bn.num_features
    vae.bn.running_mean.copy_(torch.randn(channels, generator=generator) * 0.5)
    vae.bn.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
    scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                                max_shift=1.15, shift=3.0, use_dynamic_shifting=True)
    return dict(transformer=transformer, vae=vae, scheduler=scheduler)


def build_dev(meta: frozenset[str] = frozenset()):
    """FLUX.2 [dev]: Flux2Pipeline with the tiny transformer (guidance embedding), Mistral 3 and VAE."""
    import torch
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    from genbatch.models.tiny import placed

    tokenizer = mistral_tokenizer()
    vocab = len(tokenizer)
    config = Mistral3Config(text_config={**TINY_MISTRAL, "vocab_size": vocab, **_special_ids(tokenizer)},
                            vision_config=TINY_PIXTRAL, image_token_index=vocab, tie_word_embeddings=False)
    torch.manual_seed(0)
    with placed("text_encoder", meta):
        text_encoder = Mistral3ForConditionalGeneration(config).eval()
    return Flux2Pipeline(text_encoder=text_encoder, tokenizer=tokenizer, **_shared(TINY_TRANSFORMER, meta, 1))


def _build_klein(distilled: bool, meta: frozenset[str]):
    import torch
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from genbatch.models.tiny import placed

    tokenizer = qwen3_tokenizer()
    torch.manual_seed(0)
    with placed("text_encoder", meta):
        text_encoder = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), **_special_ids(tokenizer),
                                                    **TINY_QWEN3)).eval()
    return Flux2KleinPipeline(text_encoder=text_encoder, tokenizer=tokenizer, is_distilled=distilled,
                              **_shared(TINY_KLEIN_TRANSFORMER, meta, 1))


def build_klein(meta: frozenset[str] = frozenset()):
    """FLUX.2 [klein], step-distilled (`is_distilled=True`): one branch, guidance ignored."""
    return _build_klein(True, meta)


def build_klein_base(meta: frozenset[str] = frozenset()):
    """FLUX.2 [klein] base (`is_distilled=False`): CFG against the empty prompt when guidance is above 1."""
    return _build_klein(False, meta)
