"""The families genbatch runs, and lookups over them. Adding a family: its module, plus one line here.

The family modules are imported here, lazily on first lookup (importing `genbatch.models` imports none of
them); none of them imports torch at module level.
"""

from __future__ import annotations

import importlib
from functools import cache

from genbatch.models.base import Blocks, ModelFamily, TinyPreset, TransformerPlan

FAMILY_MODULES = (
    "genbatch.models.wan",
    "genbatch.models.flux",
    "genbatch.models.sd3",
    "genbatch.models.qwen_image",
    "genbatch.models.hunyuan_video",
)
"""The modules that each define one `FAMILY` (a `ModelFamily`), in the order they are listed to users."""


@cache
def families() -> dict[str, ModelFamily]:
    """Every family, by name."""
    found: dict[str, ModelFamily] = {}
    for module in FAMILY_MODULES:
        family = importlib.import_module(module).FAMILY
        if family.name in found:
            raise ValueError(f"two family modules name the family {family.name!r}; rename one")
        found[family.name] = family
    return found


def family(name: str) -> ModelFamily:
    """The family called `name` (a `ModelSpec.family`); ValueError naming the ones there are."""
    try:
        return families()[name]
    except KeyError:
        raise ValueError(f"no model family {name!r}; genbatch runs {sorted(families())}") from None


def family_for_pipeline(pipeline_class: str) -> ModelFamily | None:
    """The family that runs the diffusers pipeline class `pipeline_class`, or None."""
    for candidate in families().values():
        if pipeline_class in candidate.pipelines:
            return candidate
    return None


def pipeline_classes() -> list[str]:
    """Every diffusers pipeline class some family runs, sorted."""
    return sorted(name for candidate in families().values() for name in candidate.pipelines)


def presets() -> dict[str, tuple[ModelFamily, TinyPreset]]:
    """Every tiny preset, by name, with its family."""
    return {preset.name: (candidate, preset) for candidate in families().values() for preset in candidate.presets}


def transformer_plan(class_name: str) -> TransformerPlan | None:
    """The plan of a transformer class, whichever family has it; None for a class no family lists."""
    for candidate in families().values():
        if class_name in candidate.transformers:
            return candidate.transformers[class_name]
    return None


def module_blocks(class_name: str) -> Blocks | None:
    """The blocks of a transformer or text encoder class, whichever family lists it; None otherwise."""
    plan = transformer_plan(class_name)
    if plan is not None:
        return plan.blocks
    for candidate in families().values():
        if class_name in candidate.text_encoders:
            return candidate.text_encoders[class_name]
    return None


def all_repeated_blocks() -> tuple[str, ...]:
    """The repeated-block paths of every module class any family lists (for a class no family lists)."""
    paths: dict[str, None] = {}
    for candidate in families().values():
        for blocks in (*(plan.blocks for plan in candidate.transformers.values()), *candidate.text_encoders.values()):
            paths.update(dict.fromkeys(blocks.repeated))
    return tuple(paths)
