"""How each text encoder runs over a job group: `--text-encoder-parallel auto|tp|fsdp|replicate`.

    tp         split over the job group's ranks by the family's plan for the encoder class (heads, MLP
               columns: one all-reduce per attention and per MLP; every rank encodes every prompt, so the
               group's ranks call it together)
    fsdp       sharded with FSDP2 over the job group (needs --fsdp: the encoders are built on the meta device
               and filled from the leader's copy, as the transformer is)
    replicate  whole on every rank
    auto       fsdp under --fsdp; otherwise tp for an encoder at least `WIDE` wide, replicate below

The peers measured that splitting wins for wide encoders and loses for narrow ones (T5-XXL, 4096 wide,
encodes 20% faster over TP; CLIP, 768 wide, 50% slower), hence the 4096 threshold of `auto`.
"""

from __future__ import annotations

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


def sharded_by_fsdp(requested: str, *, fsdp: bool) -> bool:
    """True when FSDP shards the text encoders (`auto` and `fsdp` under --fsdp)."""
    return fsdp and requested in ("auto", "fsdp")


def width(encoder) -> int:
    """An encoder's hidden size from its config (`hidden_size`, T5's `d_model`, a VL model's text config)."""
    config = encoder.config
    for source in (config, getattr(config, "text_config", None)):
        for key in ("hidden_size", "d_model"):
            value = getattr(source, key, None) if source is not None else None
            if isinstance(value, int):
                return value
    return 0


def splits(requested: str, encoder, *, fsdp: bool) -> bool:
    """True when this encoder is split tensor-parallel over the job group."""
    if sharded_by_fsdp(requested, fsdp=fsdp):
        return False
    return requested == "tp" or (requested == "auto" and width(encoder) >= WIDE)
