"""How each text encoder runs over a job group: `--text-encoder-parallel auto|tp|fsdp|replicate`.

    tp         split over the job group's ranks by the family's splits for the encoder class (heads, MLP
               columns: one all-reduce per attention and per MLP; every rank encodes every prompt, so the
               group's ranks call it together)
    fsdp       sharded with FSDP2 over the job group (needs --fsdp: the encoders are built on the meta device
               and filled from the leader's copy, as the transformer is)
    replicate  whole on every rank
    auto       tp for an encoder at least `WIDE` wide; below that fsdp under --fsdp, else replicate

The peers measured that splitting wins for wide encoders and loses for narrow ones (T5-XXL, 4096 wide,
encodes 20% faster over TP; CLIP, 768 wide, 50% slower), hence the 4096 threshold of `auto`. Under --fsdp the
choice is made per encoder before it is built (the FSDP-sharded components are built on the meta device), from
the width its saved config gives (`config_width`).
At start-up `check_splits` reads the same configs for the heads and MLP width a split encoder's job group must
divide, so a layout that cannot split an encoder fails before anything heavy loads.
"""

from __future__ import annotations

import json
import os

MODES = ("auto", "tp", "fsdp", "replicate")
"""`--text-encoder-parallel`'s values."""
WIDE = 4096
"""The hidden size from which `auto` splits an encoder (SGLang's `FOLD_MIN_HIDDEN_SIZE`)."""
DIVIDED = ("num_attention_heads", "num_heads", "num_key_value_heads", "intermediate_size", "d_ff")
"""The saved config's sizes a split encoder's group divides: its attention heads (query, key/value; T5's
`num_heads`) and its MLP width (T5's `d_ff`), read from a VL model's `text_config` (its split language model)."""


def check_mode(requested: str, *, fsdp: bool) -> None:
    """The start-up check: ValueError naming the fix for a mode that cannot run."""
    if requested not in MODES:
        raise ValueError(f"--text-encoder-parallel {requested!r}: choose one of {', '.join(MODES)}")
    if requested == "fsdp" and not fsdp:
        raise ValueError("--text-encoder-parallel fsdp shards the text encoders with FSDP over the job group: add "
                         "--fsdp, or choose tp or replicate")


def mode_for(requested: str, hidden: int, *, fsdp: bool) -> str:
    """How an encoder `hidden` wide runs: "tp", "fsdp" or "replicate" (`auto` resolved as the module says)."""
    if requested != "auto":
        return requested
    if hidden >= WIDE:
        return "tp"
    return "fsdp" if fsdp else "replicate"


def sharded_by_fsdp(requested: str, hidden: int, *, fsdp: bool) -> bool:
    """True when FSDP shards an encoder `hidden` wide (`fsdp`, or `auto` below `WIDE`, under --fsdp)."""
    return fsdp and mode_for(requested, hidden, fsdp=fsdp) == "fsdp"


def _config_width(config) -> int:
    """The hidden size a config gives (`hidden_size`, T5's `d_model`, a VL model's text config); 0 if none."""
    def get(source, key):
        return source.get(key) if isinstance(source, dict) else getattr(source, key, None)

    for source in (config, get(config, "text_config") if config is not None else None):
        for key in ("hidden_size", "d_model"):
            value = get(source, key) if source is not None else None
            if isinstance(value, int):
                return value
    return 0


def width(encoder) -> int:
    """A built encoder's hidden size, from its config."""
    return _config_width(encoder.config)


def _saved_config(pipeline_dir: str | None, component: str) -> dict | None:
    """`<dir>/<component>/config.json` as a dict; None without a directory (a preset) or a readable config."""
    if pipeline_dir is None:
        return None
    try:
        with open(os.path.join(pipeline_dir, component, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def config_width(pipeline_dir: str | None, component: str) -> int:
    """An encoder's hidden size from its saved `<dir>/<component>/config.json`, before anything is built; 0
    without a directory (a preset: tiny encoders) or a config."""
    config = _saved_config(pipeline_dir, component)
    return 0 if config is None else _config_width(config)


def check_splits(pipeline_dir: str | None, components, requested: str, group_size: int, *, fsdp: bool) -> None:
    """The start-up check of the text encoders (`components` of a pipeline directory) `requested` splits over a
    job group of `group_size` ranks, from their saved configs before anything is built: ValueError naming the
    encoder, the sizes the group does not divide (`DIVIDED`) and the fix. Without a directory (a preset) or a
    config there is nothing to read; loading then checks every split tensor of the built encoder."""
    if group_size == 1:
        return
    for component in components:
        config = _saved_config(pipeline_dir, component)
        if config is None or mode_for(requested, _config_width(config), fsdp=fsdp) != "tp":
            continue
        split = config["text_config"] if isinstance(config.get("text_config"), dict) else config  # a VL model
        problems = [f"{key} {value}" for key in DIVIDED
                    if isinstance(value := split.get(key), int) and value % group_size]
        if problems:
            raise ValueError(f"--text-encoder-parallel {requested} splits {component} over the {group_size} ranks of "
                             f"a job group, which do not divide its {', '.join(problems)}: choose a layout whose job "
                             "group (every axis but dp) divides them, or --text-encoder-parallel replicate (fsdp "
                             "with --fsdp)")


def splits(requested: str, encoder, *, fsdp: bool) -> bool:
    """True when this encoder is split tensor-parallel over the job group."""
    return mode_for(requested, width(encoder), fsdp=fsdp) == "tp"
