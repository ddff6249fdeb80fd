"""Resolving a model name to its `ModelSpec`: a tiny preset, a diffusers pipeline directory, a Hugging Face hub id
(`org/name[@revision]`, found in the local hub cache: `genbatch.models.hub`), or a published model's name
(`flux.1-dev`: `ModelFamily.published`), which stands for its hub id.

Only small JSON configs are read (never weights). The family comes from the pipeline class named in
`model_index.json`; the family module reads the rest (`ModelFamily.read_spec`). `resolve_model` needs the
model's files where the runner needs them (a published model or hub id in the cache); `resolve_model_or_published`
also takes a published model missing from the cache, read from the configs its family publishes (`gen validate`).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from functools import cache, lru_cache

from genbatch.models.base import ModelFamily
from genbatch.models.hub import HubId, HubModelMissing, cached_snapshot, parse_hub_id
from genbatch.models.shapes import Published
from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.models import registry


class ModelNotCached(UnknownModelError):
    """A published model or hub id that is not in the Hugging Face cache (and no directory of that name exists)."""


@cache
def _preset_specs() -> dict[str, ModelSpec]:
    return {
        name: family.read_spec(name, preset.transformer, preset.vae, preset.defaults, None)
        for name, (family, preset) in registry.presets().items()
    }


def preset_names() -> list[str]:
    return sorted(_preset_specs())


def published_model(name: str) -> tuple[ModelFamily, Published] | None:
    """The published model `name` names (case aside: `FLUX.1-dev` is `flux.1-dev`), with its family; None for any
    other name."""
    return registry.published().get(name.lower())


def published_spec(family: ModelFamily, model: Published, name: str | None = None) -> ModelSpec:
    """A published model's spec from the configs its family publishes: the family's `read_spec`, as for a pipeline
    directory, and what its model card says beyond them (`Published.spec_facts`); named `name` (default: its own
    name). No files are read."""
    spec = family.read_spec(name or model.name, model.transformer, model.vae, model.defaults, None)
    return replace(spec, **model.spec_facts)


def model_hub_id(name: str) -> HubId | None:
    """The hub id `name` stands for: a published model's (`flux.1-dev` -> black-forest-labs/FLUX.1-dev) or the one it
    spells (`org/name[@revision]`); None for a preset, an existing directory or any other name."""
    if name in _preset_specs() or os.path.isdir(os.path.expanduser(name)):
        return None
    published = published_model(name)
    if published is not None and published[1].hub_id:
        return HubId(repo=published[1].hub_id)
    return parse_hub_id(name)


def known_names() -> list[str]:
    """Every name `--model` takes besides directories and hub ids: the presets, then the published models."""
    return [*preset_names(), *registry.published()]


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
            f"model {name!r}{where} is not a preset, a published model (`gen models` lists both), a hub id "
            "(org/name) in the Hugging Face cache, or a directory with a model_index.json; pass one of those names, "
            "or a diffusers pipeline directory saved with save_pretrained"
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
    directory of that name wins, else the snapshot in the Hugging Face cache of the hub id it spells or stands for
    (a published model's: `model_hub_id`; never downloaded here); None for a preset. Raises `ModelNotCached` for
    a hub id missing from the cache."""
    if name in _preset_specs():
        return None
    expanded = os.path.expanduser(name)
    hub = model_hub_id(name)
    if hub is None:
        return expanded
    try:
        return cached_snapshot(hub, published=None if parse_hub_id(name) is not None else name)
    except HubModelMissing as error:
        raise ModelNotCached(str(error)) from None


@lru_cache(maxsize=64)
def resolve_model(name: str) -> ModelSpec:
    """The spec of a preset, a pipeline directory, or a published model or hub id in the Hugging Face cache;
    raises `UnknownModelError` naming the fix (`ModelNotCached` for one missing from the cache).

    Cached per name: a manifest's rows resolve each distinct model once."""
    presets = _preset_specs()
    if name in presets:
        return presets[name]
    path = model_directory(name)
    expanded = os.path.expanduser(name)
    return _spec_from_directory(expanded, path) if path == expanded else _spec_from_directory(name, path)


def resolve_model_or_published(name: str) -> ModelSpec:
    """`resolve_model`, and for a published model missing from the Hugging Face cache its spec from the configs its
    family publishes (`published_spec`: what the cached model's own configs give), so that a manifest of it is
    checked without downloading it. Its `path` is None: the runner cannot load it until it is in the cache."""
    try:
        return resolve_model(name)
    except ModelNotCached:
        published = published_model(name)
        if published is None:
            raise
        return published_spec(*published, name=name)
