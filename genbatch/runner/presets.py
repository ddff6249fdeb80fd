"""Building the built-in tiny presets by name: the families' tiny models (`genbatch.models`, each family's
`TinyPreset`), built on the CPU in fp32, with the components a rank receives only a shard of on the meta
device. The same name always gives the same weights, so two processes that build a preset hold identical
models.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from genbatch.models import presets as family_presets

PRESETS: dict[str, Callable[[frozenset[str]], object]] = {
    name: preset.build for name, (_, preset) in family_presets().items()
}
"""Preset name -> its builder, build(meta) -> pipeline."""


def build_preset(name: str, meta: Collection[str] = ()):
    """Build the named preset pipeline on the CPU in fp32.

    Components named in `meta` (e.g. "transformer") are built on the meta device: their shapes without
    their weights, for ranks that will receive only a shard of them.
    """
    try:
        builder = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)} or pass a pipeline directory") from None
    return builder(frozenset(meta))
