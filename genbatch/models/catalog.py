"""The models genbatch knows by name, as records: each family's tiny presets and published models (`gen models`).

Each record's task, guidance and default size are derived from the model's `ModelSpec` (the one its family's
`read_spec` gives), never written by hand, so they say what `gen run` does:

- task: what the rows give and what comes out. `is_video` says image or video; `media_inputs` and
  `media_required` say whether a row's `image` is required (`image-to-video`, `image-to-image`), optional
  (`text/image-to-video`, `text/image-to-image`) or refused (`text-to-video`, `text-to-image`); a required
  `last_image` makes `first/last-frame-to-video`; `audio_tokens_per_frame` adds `+sound`.
- guidance: how `guidance_scale` is used. `true CFG`: a second branch against the `negative_prompt`, run only when
  one is given (`cfg_needs_negative_prompt`); `CFG`: two branches a step (`uses_cfg`); `embedded`: one branch, the
  scale an input of the transformer (its config's `guidance_embeds`); `distilled`: one branch, no guidance.

`genbatch.planner.catalog` adds the models the planner prices but no family runs (kind `plan only`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from genbatch.models.registry import families
from genbatch.models.resolve import published_spec, resolve_model
from genbatch.models.spec import ModelSpec

PUBLISHED = "published"
"""A published model: `gen run` reads it from the Hugging Face cache by its hub id, downloading it when missing."""
PRESET = "preset"
"""A built-in tiny model: real diffusers classes with small random weights, built in memory."""
TRUE_CFG, CFG, EMBEDDED, DISTILLED = "true CFG", "CFG", "embedded", "distilled"
"""How a model uses `guidance_scale` (`guidance_of`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    """One name `--model` takes, with what `gen models` says of it."""

    name: str
    """The name to pass (`flux.1-dev`, `tiny-wan`)."""
    kind: str
    """`PUBLISHED`, `PRESET`, or `plan only` (a model the planner prices and no family runs:
    `genbatch.planner.catalog`)."""
    family: str
    """The model family (`ModelSpec.family`)."""
    hub_id: str | None
    """The hub id the name stands for (a published model's); None for a preset."""
    task: str
    """What a row gives and what comes out (`task_of`)."""
    guidance: str
    """How `guidance_scale` is used (`guidance_of`): `CFG`, `true CFG`, `embedded` or `distilled`."""
    guidance_scale: float | None
    """The default guidance scale; None when the model has none."""
    width: int | None
    """Default width in pixels."""
    height: int | None
    """Default height in pixels."""
    frames: int | None
    """Default frames of a video; None for an image model."""
    steps: int | None
    """Default denoising steps."""

    @property
    def guidance_text(self) -> str:
        """`guidance` with the default scale (`CFG 5`, `embedded 3.5`); `distilled` alone, as it uses none."""
        if self.guidance == DISTILLED or self.guidance_scale is None:
            return self.guidance
        return f"{self.guidance} {self.guidance_scale:g}"

    @property
    def size(self) -> str:
        """`width x height` (`x frames` for a video), as `1280x720x81`; `-` where the model has no default."""
        parts = [self.width, self.height, *((self.frames,) if self.frames else ())]
        return "x".join(str(part) for part in parts) if None not in parts else "-"

    def record(self) -> dict[str, Any]:
        """The entry as JSON-ready data (`gen models --json`)."""
        return asdict(self)


def task_of(spec: ModelSpec) -> str:
    """What a row of `spec` gives and what comes out (see the module docstring)."""
    inputs, required = set(spec.media_inputs), set(spec.media_required)
    output = "video" if spec.is_video else "image"
    if "last_image" in required:
        source = "first/last-frame"
    elif "image" in required:
        source = "image"
    elif "image" in inputs:
        source = "text/image"
    else:
        source = "text"
    return f"{source}-to-{output}" + ("+sound" if spec.audio_tokens_per_frame else "")


def guidance_of(spec: ModelSpec, transformer: Mapping[str, Any]) -> str:
    """How `spec` uses `guidance_scale` (see the module docstring); `transformer` is its transformer's config (for
    `guidance_embeds`)."""
    if spec.cfg_needs_negative_prompt:
        return TRUE_CFG
    if spec.uses_cfg:
        return CFG
    return EMBEDDED if transformer.get("guidance_embeds") else DISTILLED


def entry(spec: ModelSpec, *, kind: str, hub_id: str | None, transformer: Mapping[str, Any]) -> CatalogEntry:
    """The catalog entry of `spec` (named as it is), of `kind`."""
    defaults = spec.defaults

    def number(key: str) -> int | None:
        return int(defaults[key]) if defaults.get(key) is not None else None

    scale = defaults.get("guidance_scale")
    return CatalogEntry(name=spec.name, kind=kind, family=spec.family, hub_id=hub_id, task=task_of(spec),
                        guidance=guidance_of(spec, transformer), guidance_scale=None if scale is None else float(scale),
                        width=number("width"), height=number("height"),
                        frames=number("num_frames") if spec.is_video else None, steps=number("num_inference_steps"))


def family_entries() -> list[CatalogEntry]:
    """Every preset and published model of every family, family by family (`families()`' order), the presets
    first; the published models' specs from their published configs (what `gen plan` prices)."""
    entries = []
    for family in families().values():
        for preset in family.presets:
            entries.append(entry(resolve_model(preset.name), kind=PRESET, hub_id=None, transformer=preset.transformer))
        for model in family.published:
            entries.append(entry(published_spec(family, model), kind=PUBLISHED, hub_id=model.hub_id,
                                 transformer=model.transformer))
    return entries


__all__ = ["CFG", "DISTILLED", "EMBEDDED", "PRESET", "PUBLISHED", "TRUE_CFG", "CatalogEntry", "entry", "family_entries", "guidance_of", "task_of"]
