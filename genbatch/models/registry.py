"""The families genbatch runs, and lookups over them. Adding a family: its module, plus one line here; or, from
an installed package, an entry point in the group `genbatch.families` naming its `ModelFamily` (or a module
holding one as `FAMILY`), and nothing in genbatch changes:

    [project.entry-points."genbatch.families"]
    my-family = "my_package.family:FAMILY"

The family modules are imported here, lazily on first lookup (importing `genbatch.models` imports none of
them); none of them imports torch at module level. The built-in families come first, then the installed
ones, by entry-point name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types
from functools import cache

from genbatch.models.base import Blocks, ModelFamily, TinyPreset, TransformerParts
from genbatch.models.shapes import Published
from genbatch.models.vae_costs import IMAGE_DEFAULT, VIDEO_DEFAULT, VaeCosts

FAMILY_MODULES = (
    "genbatch.models.wan",
    "genbatch.models.wan_i2v",
    "genbatch.models.flux",
    "genbatch.models.flux_kontext",
    "genbatch.models.sd3",
    "genbatch.models.qwen_image",
    "genbatch.models.qwen_image_edit",
    "genbatch.models.hunyuan_video",
    "genbatch.models.hunyuan_video_i2v",
    "genbatch.models.z_image",
    "genbatch.models.qwen_image_21",
    "genbatch.models.ltx2",
    "genbatch.models.ltx2_i2v",
    "genbatch.models.flux2",
    "genbatch.models.flux2_klein",
    "genbatch.models.hunyuan_video15",
    "genbatch.models.hunyuan_video15_i2v",
)
"""The modules that each define one `FAMILY` (a `ModelFamily`), in the order they are listed to users."""
ENTRY_POINT_GROUP = "genbatch.families"
"""The entry-point group installed packages register their families under."""


def _installed_families() -> list[tuple[str, ModelFamily]]:
    """(where from, family) for each entry point of `ENTRY_POINT_GROUP`, by name; ValueError naming a broken one."""
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda entry: entry.name):
        where = f"entry point {entry.name} = {entry.value}" + (f" of {entry.dist.name}" if entry.dist else "")
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 - any failure of a third-party import is named, with the fix
            raise ValueError(f"the model family {where} does not load ({type(error).__name__}: {error}); fix or "
                             "uninstall that package") from error
        if isinstance(loaded, types.ModuleType):
            loaded = getattr(loaded, "FAMILY", None)
        if not isinstance(loaded, ModelFamily):
            raise ValueError(f"the model family {where} is a {type(loaded).__name__}, not a "
                             "genbatch.models.base.ModelFamily; point it at the family record (module:FAMILY)")
        found.append((where, loaded))
    return found


@cache
def families() -> dict[str, ModelFamily]:
    """Every family, by name: the built-in modules' (`FAMILY_MODULES`), then the installed packages'."""
    found: dict[str, ModelFamily] = {}
    origin: dict[str, str] = {}
    listed = [(f"module {module}", importlib.import_module(module).FAMILY) for module in FAMILY_MODULES]
    for where, family in listed + _installed_families():
        if family.name in found:
            raise ValueError(f"the {where} and the {origin[family.name]} both name the family {family.name!r}; "
                             "rename one")
        found[family.name], origin[family.name] = family, where
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


def published() -> dict[str, tuple[ModelFamily, Published]]:
    """Every published model a family runs (`ModelFamily.published`), by name, with its family."""
    return {model.name: (candidate, model) for candidate in families().values() for model in candidate.published}


def transformer_parts(class_name: str) -> TransformerParts | None:
    """The parts of a transformer class, whichever family has it; None for a class no family lists."""
    for candidate in families().values():
        if class_name in candidate.transformers:
            return candidate.transformers[class_name]
    return None


def module_blocks(class_name: str) -> Blocks | None:
    """The blocks of a transformer or text encoder class, whichever family lists it; None otherwise."""
    parts = transformer_parts(class_name)
    if parts is not None:
        return parts.blocks
    for candidate in families().values():
        if class_name in candidate.text_encoders:
            return candidate.text_encoders[class_name]
    return None


def vae_costs_of_class(class_name: str, *, is_video: bool) -> VaeCosts:
    """The costs of the VAE class `class_name`, from the family record that names them (`ModelFamily.vae_costs`);
    a class no family prices is priced as Wan's VAE (video) or the image VAE."""
    for candidate in families().values():
        if candidate.vae_costs is not None and candidate.vae_costs.vae_class == class_name:
            return candidate.vae_costs
    return VIDEO_DEFAULT if is_video else IMAGE_DEFAULT


def all_repeated_blocks() -> tuple[str, ...]:
    """The repeated-block paths of every module class any family lists (for a class no family lists)."""
    paths: dict[str, None] = {}
    for candidate in families().values():
        for blocks in (*(parts.blocks for parts in candidate.transformers.values()), *candidate.text_encoders.values()):
            paths.update(dict.fromkeys(blocks.repeated))
    return tuple(paths)
