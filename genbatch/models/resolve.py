"""Resolving a model name to its `ModelSpec`: a tiny preset, a diffusers pipeline directory, or a Hugging Face
hub id (`org/name[@revision]`, found in the local hub cache: `genbatch.models.hub`).

Only small JSON configs are read (never weights). The family comes from the pipeline class named in
`model_index.json`; the family module reads the rest (`ModelFamily.read_spec`).
"""

from __future__ import annotations

import json
import os
from functools import cache, lru_cache

from genbatch.models.hub import HubModelMissing, cached_snapshot, parse_hub_id
from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.models import registry


@cache
def _preset_specs() -> dict[str, ModelSpec]:
    return {
        name: family.read_spec(name, preset.transformer, preset.vae, preset.defaults, None)
        for name, (family, preset) in registry.presets().items()
    }


def preset_names() -> list[str]:
    return sorted(_preset_specs())


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _spec_from_directory(name: str, path: str | None = None) -> ModelSpec:
    """The spec of the pipeline directory `path` (default: `name` itself), named `name`."""
    path = path or name
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        where = "" if path == name else f" (its snapshot {path})"
        raise UnknownModelError(
            f"model {name!r}{where} is not a preset ({', '.join(preset_names())}), a hub id (org/name) in the "
            "Hugging Face cache, or a directory with a model_index.json; pass a diffusers pipeline directory "
            "saved with save_pretrained"
        )
    index = _read_json(index_path)
    pipeline_class = index.get("_class_name", "")
    family = registry.family_for_pipeline(pipeline_class)
    if family is None:
        raise UnknownModelError(
            f"model {name!r} is a {pipeline_class or 'pipeline of unknown class'}; genbatch runs "
            f"{', '.join(registry.pipeline_classes())}"
        )
    try:
        transformer = _read_json(os.path.join(path, "transformer", "config.json"))
        vae = _read_json(os.path.join(path, "vae", "config.json"))
        return family.read_spec(name, transformer, vae, None, path)
    except (OSError, ValueError, KeyError, TypeError) as error:  # missing or unreadable component configs
        raise UnknownModelError(
            f"model {name!r} is an incomplete {pipeline_class} directory ({type(error).__name__}: {error}); "
            "pass a whole diffusers pipeline directory saved with save_pretrained"
        ) from error


def model_directory(name: str) -> str | None:
    """The local pipeline directory `name` refers to, as diffusers' `from_pretrained` finds it: an existing
    directory of that name wins, else a hub id's snapshot in the Hugging Face cache (never downloaded
    here); None for a preset. Raises `UnknownModelError` for a hub id missing from the cache."""
    if name in _preset_specs():
        return None
    expanded = os.path.expanduser(name)
    hub = None if os.path.isdir(expanded) else parse_hub_id(name)
    if hub is None:
        return expanded
    try:
        return cached_snapshot(hub)
    except HubModelMissing as error:
        raise UnknownModelError(str(error)) from None


@lru_cache(maxsize=64)
def resolve_model(name: str) -> ModelSpec:
    """The spec of a preset, a pipeline directory or a cached hub id; raises `UnknownModelError` naming the fix.

    Cached per name: a manifest's rows resolve each distinct model once."""
    presets = _preset_specs()
    if name in presets:
        return presets[name]
    path = model_directory(name)
    expanded = os.path.expanduser(name)
    return _spec_from_directory(expanded, path) if path == expanded else _spec_from_directory(name, path)
