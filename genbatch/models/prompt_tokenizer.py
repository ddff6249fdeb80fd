"""An in-memory tokenizer for tiny presets whose pipelines wrap the prompt in a template and crop it off.

Qwen-Image and HunyuanVideo format the prompt into a chat template, encode the whole text, then drop a
fixed number of leading tokens (`prompt_template_encode_start_idx`, `crop_start`): the template's prefix as
their real tokenizers count it. A one-token-per-character tokenizer would make that prefix hundreds of tokens
long, so the crop would keep template text and HunyuanVideo's fixed-length truncation would cut the prompt
away. This tokenizer reads the template instead: its `<|...|>` markers are single special tokens, its words
are whole tokens, and any other word is spelled out a character at a time (WordPiece continuation pieces),
so distinct prompts give distinct ids (up to whitespace). A few template words are spelled out too, chosen
so that the prefix is exactly as many tokens as the pipeline crops.

Built from the template alone (no files, no downloads); it saves and reloads like any fast tokenizer.
"""

from __future__ import annotations

import re
import string

_MARKER = re.compile(r"<\|[a-z_]+\|>")
_WORD = re.compile(r"\w+|[^\w\s]")  # the pieces the BERT pre-tokenizer splits text into
_SPECIALS = ("<pad>", "</s>", "<unk>")
_CHARACTERS = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation


def _pieces(text: str) -> list[str]:
    """The template's text split as the tokenizer splits it, markers as single pieces."""
    pieces: list[str] = []
    position = 0
    for marker in _MARKER.finditer(text):
        pieces += _WORD.findall(text[position:marker.start()]) + [marker.group()]
        position = marker.end()
    return pieces + _WORD.findall(text[position:])


def _spelled_out(prefix: list[str], target: int) -> set[str]:
    """Template words to spell out a character at a time so that `prefix` becomes `target` tokens long."""
    missing = target - len(prefix)
    if missing < 0:
        raise ValueError(f"the template's prefix is {len(prefix)} tokens even with whole words, more than the "
                         f"{target} the pipeline crops; give the tokenizer a shorter template or a larger crop")
    words = [piece for piece in dict.fromkeys(prefix) if len(piece) > 1 and not _MARKER.fullmatch(piece)]
    chosen: set[str] = set()
    # Longest first: each spelled-out word adds (len - 1) tokens per occurrence in the prefix.
    for word in sorted(words, key=lambda w: (-(len(w) - 1) * prefix.count(w), w)):
        gain = (len(word) - 1) * prefix.count(word)
        if gain <= missing:
            chosen.add(word)
            missing -= gain
    if missing:
        raise ValueError(f"cannot make the template's prefix exactly {target} tokens (off by {missing}); "
                         "pick another crop length for this template")
    return chosen


def template_tokenizer(template: str, prefix_tokens: int, model_max_length: int):
    """A tokenizer for `template` (with one `{}` for the prompt) whose prefix before `{}` is exactly
    `prefix_tokens` tokens, the number the pipeline crops off the encoded text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    head, _, tail = template.partition("{}")
    prefix = _pieces(head)
    spelled = _spelled_out(prefix, prefix_tokens)
    words = [p for p in dict.fromkeys(prefix + _pieces(tail)) if len(p) > 1 and not _MARKER.fullmatch(p)]
    vocabulary = [*_SPECIALS, *_CHARACTERS, *(f"##{c}" for c in _CHARACTERS), *(w for w in words if w not in spelled)]
    core = Tokenizer(models.WordPiece(vocab={token: i for i, token in enumerate(vocabulary)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=sorted(set(_MARKER.findall(template))),
        model_max_length=model_max_length,
    )
