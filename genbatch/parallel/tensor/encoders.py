"""How each text encoder runs over a job group: `--text-encoder-parallel auto|tp|fsdp|replicate`.

    tp         split over the job group's ranks by the family's plan for the encoder class (heads, MLP
               columns: one all-reduce per attention and per MLP; every rank encodes every prompt, so the
               group's ranks call it together)
    fsdp       sharded with FSDP2 over the job group (needs --fsdp: the encoders are built on the meta device
               and filled from the leader's copy, as the transformer is)
    replicate  whole on every rank
    auto       tp for an encoder at least `WIDE` wide; below that fsdp under --fsdp, else replicate

The peers measured that splitting wins for wide encoders and loses for narrow ones (T5-XXL, 4096 wide,
encodes 20% faster over TP; CLIP, 768 wide, 50% slower), hence the 4096 threshold of `auto`. Under --fsdp the choice is made per encoder before it is built (the
FSDP-sharded components are built on the meta device), from the width its saved config gives (`config_width`).
"""

from __future__ import annotations

import json
import os

MODES = ("auto", "tp", "fsdp", "replicate")
"""`--text-encoder-parallel`'s values."""
WIDE = 4096
"""The hidden size from which `auto` splits an encoder (SGLang's `FOLD_MIN_HIDDEN_SIZE`)."""


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


def config_width(pipeline_dir: str | None, component: str) -> int:
    """An encoder's hidden size from its saved `<dir>/<component>/config.json`, before anything is built; 0
    without a directory (a preset: tiny encoders) or a config."""
    if pipeline_dir is None:
        return 0
    try:
        with open(os.path.join(pipeline_dir, component, "config.json"), encoding="utf-8") as handle:
            return _config_width(json.load(handle))
    except (OSError, ValueError):
        return 0


def splits(requested: str, encoder, *, fsdp: bool) -> bool:
    """True when this encoder is split tensor-parallel over the job group."""
    return mode_for(requested, width(encoder), fsdp=fsdp) == "tp"
