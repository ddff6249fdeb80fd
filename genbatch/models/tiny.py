"""What the families' tiny presets are built from: an in-memory tokenizer, small text-encoder configs, and
meta-device placement of the components a rank receives only a shard of.

The presets are the real diffusers classes with small configs and seeded random weights: they make a run
possible anywhere (no hub, no GPU) and give the tests real architectures. Each function imports torch or
transformers when called, never at import.
"""

from __future__ import annotations

import contextlib
import string


def placed(component: str, meta: frozenset[str]):
    """A context that builds `component` on the meta device when it is named in `meta` (shapes only)."""
    import torch

    return torch.device("meta") if component in meta else contextlib.nullcontext()


def character_tokenizer(model_max_length: int):
    """A tokenizer with one token per character, built in memory (no files, no downloads).

    Every distinct prompt gives distinct ids, and it saves and reloads like any fast tokenizer.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    alphabet = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation + " ")
    vocab = {token: index for index, token in enumerate(specials + alphabet)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
    )


def t5_config(vocab_size: int) -> dict:
    """A two-layer T5 / UMT5 encoder's config."""
    return dict(
        vocab_size=vocab_size,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def clip_config(vocab_size: int):
    """A two-layer CLIP text encoder's config."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )



def seeded(seed: int, build, component: str | None = None, meta: frozenset[str] = frozenset()):
    """`build()` in eval mode, its random weights drawn after `torch.manual_seed(seed)`; on the meta device
    when `component` is named in `meta`."""
    import torch

    torch.manual_seed(seed)
    with placed(component, meta) if component is not None else contextlib.nullcontext():
        return build().eval()
