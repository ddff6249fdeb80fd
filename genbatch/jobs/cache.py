"""Step-caching modes as written in `--cache` and the manifest's `cache` column: parsed, checked, canonical.

    none                  every step computes every block (the default)
    fbc:THRESHOLD         First-Block Cache: block 0 always runs; when the relative L1 change of its residual
                          since the last full step is at most THRESHOLD (>= 0), the other blocks are skipped
                          and their cached residual is added instead
    taylorseer:INTERVAL   TaylorSeer: after three warm-up steps, one full step in every INTERVAL (>= 1); the
                          attention and feed-forward outputs of the other steps are predicted from a first-order
                          Taylor expansion of the last full steps
    teacache:THRESHOLD    TeaCache: the relative L1 change of the first block's timestep-modulated input,
                          rescaled by the model's published polynomial, is accumulated; while the sum stays
                          below THRESHOLD (>= 0) every block is skipped and the cached residual added. Only
                          for the models with published coefficients (`genbatch.models.teacache`)

Pure string handling (no torch): the manifest checks each row's value with `cache_problem`, the CLIs check
the run-level option at start-up with `parse_cache`, and `genbatch.parallel.cache` runs the parsed mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NONE = "none"
FBC = "fbc"
TAYLORSEER = "taylorseer"
TEACACHE = "teacache"
KINDS = (NONE, FBC, TAYLORSEER, TEACACHE)
"""The modes that run."""
USAGE = ("none, fbc:THRESHOLD (e.g. fbc:0.08), taylorseer:INTERVAL (e.g. taylorseer:3) or teacache:THRESHOLD "
         "(e.g. teacache:0.2)")


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheMode:
    """One parsed step-caching mode."""

    kind: str = NONE
    """`none`, `fbc`, `taylorseer` or `teacache` (`KINDS`)."""
    threshold: float = 0.0
    """fbc: the largest relative L1 change of block 0's residual at which the other blocks are skipped;
    teacache: the accumulated rescaled change below which every block is skipped."""
    interval: int = 1
    """taylorseer: one full step in every `interval` after the warm-up (1: every step is full)."""

    @property
    def enabled(self) -> bool:
        return self.kind != NONE

    def __str__(self) -> str:
        """The canonical text (`fbc:0.08`, `taylorseer:3`, `none`): what results rows and fingerprints carry."""
        if self.kind in (FBC, TEACACHE):
            return f"{self.kind}:{self.threshold:g}"
        if self.kind == TAYLORSEER:
            return f"{TAYLORSEER}:{self.interval}"
        return NONE


def parse_cache(text: str | None) -> CacheMode:
    """`text` as a `CacheMode` (None: none); ValueError naming the bad value and the accepted forms."""
    if text is None:
        return CacheMode()
    value = text.strip().lower()
    if value == NONE:
        return CacheMode()
    kind, colon, argument = value.partition(":")
    if kind not in KINDS or not colon:
        raise ValueError(f"{text!r} is not a cache mode; use {USAGE}")
    if kind in (FBC, TEACACHE):
        try:
            threshold = float(argument)
        except ValueError:
            threshold = math.nan
        if not (math.isfinite(threshold) and threshold >= 0):
            example = "fbc:0.08" if kind == FBC else "teacache:0.2"
            raise ValueError(f"{text!r}: the {kind} threshold must be a finite number >= 0, e.g. {example} "
                             f"({kind}:0 skips nothing)")
        return CacheMode(kind=kind, threshold=threshold)
    if not argument.isdigit() or int(argument) < 1:
        raise ValueError(f"{text!r}: the taylorseer interval must be a whole number >= 1, e.g. taylorseer:3 "
                         "(taylorseer:1 predicts nothing)")
    return CacheMode(kind=TAYLORSEER, interval=int(argument))


def cache_problem(text: str | None) -> str | None:
    """Why `text` is not a cache mode (for a manifest row's rejection), or None when it is one."""
    try:
        parse_cache(text)
    except ValueError as error:
        return str(error)
    return None


def canonical_cache(text: str | None) -> str:
    """The canonical text of a valid mode (`FBC:0.080` -> `fbc:0.08`; None -> `none`)."""
    return str(parse_cache(text))
