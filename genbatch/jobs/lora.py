"""A row's LoRA adapters: the `lora` column's value, the run's `--lora` defaults, and one canonical text of both.

    lora: list<struct<uri: string, scale: double, weight_name: string, expert: string>>   (only `uri` is required)

A `uri` is one of
    - a hub id, `org/name` or `org/name@revision` (resolved from the Hugging Face cache as `--model` ids are);
    - a path (relative to the manifest's own directory; write `./dir/name` for a relative directory that
      would otherwise read as a hub id) or any fsspec URL, of a `.safetensors` file or of a directory that
      holds one (`weight_name` picks among several).
`scale` multiplies the adapter's delta (default 1.0). `expert` picks the transformer of a two-expert model
(Wan 2.2 A14B) the adapter goes into: `high` (the high-noise expert, `transformer`: the default, as diffusers'
`load_lora_weights`) or `low` (`transformer_2`, as its `load_into_transformer_2=True`); the Wan 2.2 distilled
LoRAs ship one file per expert. A null value takes the run's `--lora`; an empty list means no adapter.
Adapters load with safetensors only: a pickle file (`.bin`, `.pt`, ...) is refused, with the fix. Nothing is
read here (`genbatch.runner.adapters` reads and applies them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from genbatch.jobs.hub_id import HubId, parse_hub_id
from genbatch.jobs.media import media_url

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""File names genbatch never loads: formats that unpickle (run code) when read."""

LORA_TYPE = "list<struct<uri: string, scale: double, weight_name: string, expert: string>>"
"""The `lora` column's Arrow type, as messages spell it."""

EXPERTS = {"high": "transformer", "low": "transformer_2"}
"""A two-expert model's experts -> the pipeline component each is (Wan 2.2: high noise first, then low)."""

TO_SAFETENSORS = ("convert it to safetensors, e.g. safetensors.torch.save_file(torch.load(path, weights_only=True), "
                  "'adapter.safetensors'), and name that file")


@dataclass(frozen=True, slots=True)
class LoraRef:
    """One adapter a job applies."""

    uri: str
    """A hub id (kept as written) or an absolute URL (a relative manifest path taken from its directory)."""
    scale: float = 1.0
    """The factor on the adapter's delta."""
    weight_name: str | None = None
    """The file to take in a directory or repository that holds several; None: its only one."""
    expert: str | None = None
    """`high` or `low`: the expert of a two-expert model it goes into (`EXPERTS`); None: the transformer."""

    @property
    def is_hub_id(self) -> bool:
        return is_hub_uri(self.uri)

    @property
    def component(self) -> str:
        """The pipeline component its transformer layers go into."""
        return EXPERTS[self.expert or "high"]

    def as_dict(self) -> dict[str, object]:
        entry: dict[str, object] = {"uri": self.uri, "scale": self.scale, "weight_name": self.weight_name}
        if self.expert is not None:  # absent otherwise: a set without experts keeps the text it always had
            entry["expert"] = self.expert
        return entry


def adapter_hub_id(uri: str, weight_name: str | None) -> HubId:
    """The hub id of an adapter `uri` (a hub id), scoped to its `weight_name` file when it names one: a LoRA
    in a repository of many files is the one file to download and look up."""
    hub = parse_hub_id(uri.strip())
    if hub is None:
        raise ValueError(f"adapter {uri!r} is no hub id (org/name or org/name@revision)")
    return replace(hub, files=(weight_name,)) if weight_name else hub


def is_hub_uri(uri: str) -> bool:
    """Whether `uri` names a hub repository (`org/name[@revision]`), not a path or URL."""
    return "://" not in uri and not uri.endswith(".safetensors") and parse_hub_id(uri) is not None


def pickle_problem(name: str) -> str | None:
    """Why the file `name` is refused (a pickle format), or None."""
    if name.lower().rstrip("/").endswith(PICKLE_SUFFIXES):
        return f"{name} is a pickle file, and genbatch loads adapters with safetensors only; {TO_SAFETENSORS}"
    return None


def _entry(entry: object, index: int, base: str | None) -> LoraRef:
    where = f"adapter {index}"
    if isinstance(entry, str):
        entry = {"uri": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is {type(entry).__name__}, not a struct; write {LORA_TYPE}")
    uri, scale, weight_name = entry.get("uri"), entry.get("scale"), entry.get("weight_name")
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"{where} has no uri; give a hub id (org/name), a path or a URL of a .safetensors file")
    uri = uri.strip()
    if scale is None:
        scale = 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{where} ({uri}) has scale {scale!r}; give a finite number (1.0 applies it fully)")
    if weight_name is not None and (not isinstance(weight_name, str) or not weight_name.strip()):
        raise ValueError(f"{where} ({uri}) has an empty weight_name; name a .safetensors file or leave it null")
    problem = pickle_problem(weight_name or uri)
    if problem:
        raise ValueError(f"{where}: {problem}")
    expert = entry.get("expert")
    if expert is not None and expert not in EXPERTS:
        raise ValueError(f"{where} ({uri}) has expert {expert!r}; give one of {', '.join(map(repr, EXPERTS))} (the "
                         "high- or low-noise transformer of a two-expert model) or leave it null")
    if not is_hub_uri(uri):
        uri = media_url(uri, base)
    return LoraRef(uri=uri, scale=float(scale), weight_name=weight_name, expert=expert)


def parse_lora(value: object, base: str | None) -> tuple[LoraRef, ...] | None:
    """A row's `lora` value as adapters (None: null, the run's `--lora` applies; (): none); ValueError naming
    the adapter and the fix. `base`: where relative paths point from (the manifest's directory)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{value!r} is not a list of adapters; write {LORA_TYPE}")
    return tuple(_entry(entry, index, base) for index, entry in enumerate(value))


def run_loras(uris: Sequence[str], scales: Sequence[float]) -> tuple[LoraRef, ...]:
    """The run-level `--lora URI` flags, each paired by order with a `--lora-scale` (default 1.0), relative
    paths taken from the working directory; ValueError naming the fix."""
    if len(scales) > len(uris):
        raise ValueError(f"{len(scales)} --lora-scale for {len(uris)} --lora; give one scale per adapter, in order")
    import os

    entries = [{"uri": uri, "scale": scales[index] if index < len(scales) else 1.0} for index, uri in enumerate(uris)]
    return parse_lora(entries, os.getcwd()) or ()  # a relative path is the caller's


def lora_text(adapters: Sequence[LoraRef], sha256: Sequence[str] = ()) -> str | None:
    """The canonical text of a job's adapters (the job table's `lora` column; null for none): equal sets of
    adapters in the same order give equal text. With the files' `sha256` (the results row), each entry
    carries its own."""
    if not adapters:
        return None
    entries = [adapter.as_dict() for adapter in adapters]
    for entry, digest in zip(entries, sha256, strict=False):
        entry["sha256"] = digest
    return json.dumps(entries, separators=(",", ":"))


def from_text(text: str | None) -> tuple[LoraRef, ...]:
    """The adapters of `lora_text`'s text."""
    if not text:
        return ()
    return tuple(LoraRef(uri=entry["uri"], scale=entry["scale"], weight_name=entry["weight_name"],
                         expert=entry.get("expert")) for entry in json.loads(text))
