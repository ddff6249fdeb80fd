"""A job's LoRA adapters: found, read, converted by diffusers, checked against the model, and switched in.

    adapters = Adapters(policy=..., storage_options=..., timeout_s=...)
    switch = adapters.switch_for(job, spec, pipe, group)    # prepared once per adapter
    if switch.needed: switch.apply()                        # base + this set's deltas, in place

Each distinct adapter (its URI, weight name and model) is prepared once, before the first job that uses it:
the group leader finds its file (a hub id in the hub cache, a directory's only `.safetensors` or its
`weight_name`), reads it under the run's media policy (`genbatch.io.adapter_file`: safetensors only, bounded
by its header), converts it with the pipeline's own diffusers `lora_state_dict` (kohya, the original
Wan/ComfyUI `diffusion_model.*` layout, XLabs, ... into diffusers keys), and checks every key against the
model: a key that names no module, or a shape of another architecture, fails the job naming the first of them
and the fix. The group receives the leader's result, so every rank agrees; a failed adapter fails each later
job that names it with the same reason, without reading it again.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from genbatch.io.adapter_file import AdapterError, read_adapter
from genbatch.jobs.lora import LoraRef, adapter_hub_id, pickle_problem
from genbatch.jobs.spec import JobSpec
from genbatch.models.spec import ModelSpec
from genbatch.parallel.comm import Comm
from genbatch.parallel.lora import LoraLayer, LoraWeights
from genbatch.parallel.pipeline.stages import stage_name

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

    from genbatch.io.media_policy import MediaPolicy

_PREFERRED = "pytorch_lora_weights.safetensors"
"""The file diffusers' `save_lora_weights` writes, taken first in a directory that holds several."""
_SHOWN = 3
"""Keys or shapes a message names."""
_FIX = "name a .safetensors file, or a directory that holds one"
_FACTORS = re.compile(r"^(?P<component>[^.]+)\.(?P<module>.+)\.(?P<part>lora_A\.weight|lora_B\.weight|lora_B\.bias)$")


class LoraError(ValueError):
    """An adapter a job cannot apply; the message names the adapter, the reason and the fix."""


def adapter_file(ref: LoraRef, storage_options: dict | None = None) -> str:
    """The `.safetensors` file `ref` names: a file URL as given; in a directory (or a hub snapshot) its
    `weight_name`, else its only `.safetensors` (diffusers' own file name first)."""
    if ref.is_hub_id:
        from genbatch.models.hub import HubModelMissing, cached_snapshot

        try:
            root = cached_snapshot(adapter_hub_id(ref.uri, ref.weight_name))
        except HubModelMissing as error:
            raise LoraError(f"adapter {ref.uri}: {error}") from None
    else:
        root = ref.uri
    if ref.weight_name is not None:
        return f"{root.rstrip('/')}/{ref.weight_name}"
    if root.endswith(".safetensors"):
        return root
    import fsspec

    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    if not fs.isdir(path):
        if fs.exists(path):
            problem = pickle_problem(root)
            raise LoraError(problem or f"adapter {ref.uri}: not a .safetensors file; {_FIX}")
        raise LoraError(f"adapter {ref.uri}: no such file or directory; check the path, or copy the adapter there")
    names = sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(path, detail=False))
    found = [name for name in names if name.endswith(".safetensors")]
    if _PREFERRED in found:
        found = [_PREFERRED]
    if len(found) != 1:
        pickles = [name for name in names if pickle_problem(name)]
        why = (f"holds {', '.join(found)}; pick one with weight_name" if found else
               f"holds no .safetensors file ({', '.join(pickles)} {'is' if len(pickles) == 1 else 'are'} pickle; "
               "convert to safetensors)" if pickles else "holds no .safetensors file")
        raise LoraError(f"adapter {ref.uri}: {why}")
    return f"{root.rstrip('/')}/{found[0]}"


def _alpha(metadata: dict, component: str, module: str, alphas: dict) -> float | None:
    """The adapter's alpha for one module: kohya's per-module `alpha`, else the `lora_alpha` (and
    `alpha_pattern`) diffusers stores in the file's `lora_adapter_metadata`; None: alpha = r."""
    if f"{component}.{module}.alpha" in alphas:
        return float(alphas[f"{component}.{module}.alpha"])
    config = metadata.get(component) or {}
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.search(rf"(^|\.){pattern}$", module):
            return float(value)
    return None if config.get("lora_alpha") is None else float(config["lora_alpha"])


def _adapter_metadata(raw: dict) -> dict:
    """component -> its peft config fields, from the header's `lora_adapter_metadata` (`transformer.r`, ...)."""
    text = raw.get("lora_adapter_metadata")
    try:
        flat = json.loads(text) if text else {}
    except ValueError:
        return {}
    nested: dict[str, dict] = {}
    for key, value in flat.items():
        component, _, name = key.partition(".")
        nested.setdefault(component, {})[name] = value
    return nested


_TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")


def _text_encoders_in_peft_names(pipe, state: dict) -> dict:
    """`state` with each text encoder's keys in peft names, as diffusers' text-encoder loader makes them:
    `convert_state_dict_to_diffusers` (the old `to_q_lora.down` names kohya's CLIP attention layers convert
    to, told apart from its MLPs' `lora_linear_layer` names), then `convert_state_dict_to_peft`, and a
    `text_model.` prefix the loaded encoder has no module for dropped."""
    from diffusers.utils.state_dict_utils import (StateDictType, convert_state_dict_to_diffusers,
                                                  convert_state_dict_to_peft)

    kept, encoders = {}, {}
    for key, value in state.items():
        component, _, rest = key.partition(".")
        if component in _TEXT_ENCODERS:
            encoders.setdefault(component, {})[rest] = value
        else:
            kept[key] = value
    for component, part in encoders.items():
        if not all(".lora_A." in key or ".lora_B." in key for key in part):
            old = any("_lora.down." in key or "_lora.up." in key for key in part)
            part = convert_state_dict_to_peft(convert_state_dict_to_diffusers(
                part, original_type=StateDictType.DIFFUSERS_OLD if old else None))
        if not hasattr(getattr(pipe, component, None), "text_model"):
            part = {key.removeprefix("text_model."): value for key, value in part.items()}
        kept.update({f"{component}.{key}": value for key, value in part.items()})
    return kept


def convert(pipe, tensors: dict, metadata: dict, uri: str) -> tuple[list[LoraLayer], list[str]]:
    """The adapter's layers in diffusers keys (`lora_state_dict` of the pipeline's class), and the keys that
    are no LoRA factor this loader merges."""
    loader = getattr(type(pipe), "lora_state_dict", None)
    if loader is None:
        raise LoraError(f"adapter {uri}: {type(pipe).__name__} has no diffusers LoRA loader; run the row without it")
    try:
        if "return_alphas" in loader.__code__.co_varnames:
            state, alphas = loader(dict(tensors), return_alphas=True)
        else:
            state, alphas = loader(dict(tensors)), None
    except (ValueError, KeyError, RuntimeError) as error:
        raise LoraError(f"adapter {uri}: diffusers cannot convert it ({error}); use a LoRA trained for this model") from None
    state = _text_encoders_in_peft_names(pipe, state)
    alphas = {key if key.split(".", 1)[0] in ("transformer", *_TEXT_ENCODERS) else f"transformer.{key}": value
              for key, value in (alphas or {}).items()}
    config = _adapter_metadata(metadata)
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    stray = []
    for key, value in state.items():
        match = _FACTORS.match(key)
        if match is None:
            stray.append(key)
            continue
        parts.setdefault((match["component"], match["module"]), {})[match["part"]] = value
    layers = []
    for (component, module), found in parts.items():
        if "lora_A.weight" not in found or "lora_B.weight" not in found:
            stray.extend(f"{component}.{module}.{part}" for part in found)
            continue
        down, up = found["lora_A.weight"], found["lora_B.weight"]
        alpha = _alpha(config, component, module, alphas)
        rank = down.shape[0]
        layers.append(LoraLayer(component=component, module=module, down=down, up=up, bias=found.get("lora_B.bias"),
                                scale=1.0 if alpha is None else alpha / rank))
    return layers, stray


def _mismatch(pipe, layers: list[LoraLayer], model_name: str, uri: str) -> None:
    """LoraError naming the first keys that match no module, or the first shapes of another architecture."""
    missing, shapes = [], []
    for layer in layers:
        model = getattr(pipe, layer.component, None)
        name = f"{layer.component}.{layer.module}"
        if not isinstance(model, torch.nn.Module):
            missing.append(name)
            continue
        local = stage_name(model, f"{layer.module}.weight")
        if local is None:
            continue  # a block another PipeFusion stage holds (checked there)
        try:
            weight = model.get_parameter(local)
        except AttributeError:
            missing.append(name)
            continue
        if weight.dim() != 2 or layer.down.dim() != 2 or layer.up.dim() != 2:
            shapes.append(f"{name}: a {weight.dim()}-d weight")
            continue
        out, width = weight.shape
        if layer.up.shape[0] != out or layer.down.shape[1] != width or layer.up.shape[1] != layer.down.shape[0]:
            shapes.append(f"{name}: B {tuple(layer.up.shape)} @ A {tuple(layer.down.shape)} for a weight "
                          f"{(out, width)}")
    if missing:
        raise LoraError(f"adapter {uri}: {len(missing)} of its layers match no module of {model_name} (first: "
                        f"{', '.join(missing[:_SHOWN])}); use a LoRA trained for {model_name}")
    if shapes:
        raise LoraError(f"adapter {uri} is for another architecture than {model_name}: {'; '.join(shapes[:_SHOWN])}; "
                        f"use a LoRA trained for {model_name}")


@dataclass(frozen=True, slots=True)
class PreparedAdapter:
    """One adapter, read and checked, ready to merge."""

    sha256: str
    layers: tuple[LoraLayer, ...]


@dataclass(kw_only=True, slots=True)
class Adapters:
    """The adapters of a run on one rank: prepared once each, switched per job."""

    policy: MediaPolicy | None = None
    """The run's `genbatch.io.media_policy.MediaPolicy` (None: any URL)."""
    storage_options: dict = field(default_factory=dict)
    timeout_s: float = 120.0
    _prepared: dict = field(default_factory=dict)
    _weights: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    """pipeline -> its LoraWeights (gone with the pipeline when the pipeline cache lets it go)."""

    def _read(self, ref: LoraRef, spec: ModelSpec, pipe) -> PreparedAdapter:
        url = adapter_file(ref, self.storage_options)
        problem = pickle_problem(url)
        if problem:
            raise LoraError(f"adapter {ref.uri}: {problem}")
        try:
            found = read_adapter(url, policy=self.policy, storage_options=self.storage_options,
                                 timeout_s=self.timeout_s)
        except AdapterError as error:  # it names the file
            raise LoraError(f"adapter {error}") from None
        layers, stray = convert(pipe, found.tensors, found.metadata, ref.uri)
        if stray:
            raise LoraError(f"adapter {ref.uri}: {len(stray)} of its keys are no LoRA layer this loader merges "
                            f"(first: {', '.join(sorted(stray)[:_SHOWN])}); use a LoRA trained for {spec.name}")
        if not layers:
            raise LoraError(f"adapter {ref.uri}: holds no LoRA layer (lora_A / lora_B pairs); use a LoRA file")
        _mismatch(pipe, layers, spec.name, ref.uri)
        return PreparedAdapter(sha256=found.sha256, layers=tuple(layers))

    def prepare(self, ref: LoraRef, spec: ModelSpec, pipe, group: Comm | None = None) -> PreparedAdapter:
        """`ref` for `spec`, prepared once (the leader reads it, the group receives the result); LoraError."""
        key = (ref.uri, ref.weight_name, spec.name)
        if key not in self._prepared:
            result: PreparedAdapter | str
            if group is None or group.rank == 0:
                try:
                    result = self._read(ref, spec, pipe)
                except LoraError as error:
                    result = str(error)
            if group is not None and group.size > 1:
                result = group.broadcast_object(result if group.rank == 0 else None)
            self._prepared[key] = result
        result = self._prepared[key]
        if isinstance(result, str):
            raise LoraError(result)
        return result

    def merged(self, pipe) -> bool:
        """Whether some adapter set is merged into `pipe` now."""
        weights = self._weights.get(pipe)
        return weights is not None and weights.active is not None

    def switch_for(self, job: JobSpec, spec: ModelSpec, pipe, group: Comm | None = None) -> AdapterSwitch:
        """The job's adapters, prepared (once each), as a switch of `pipe`'s weights; LoraError naming the
        adapter and the fix."""
        for ref in job.lora:
            if ref.component != "transformer" and getattr(pipe, ref.component, None) is None:
                raise LoraError(f"adapter {ref.uri}: expert {ref.expert!r} is the {ref.component} of a two-expert "
                                f"model (Wan 2.2 A14B), and {spec.name} has one transformer; leave expert null")
        prepared = [(ref, self.prepare(ref, spec, pipe, group)) for ref in job.lora]
        weights = self._weights.setdefault(pipe, LoraWeights())
        key = tuple((ref.uri, ref.weight_name, ref.scale, ref.expert, adapter.sha256)
                    for ref, adapter in prepared) or None
        # an adapter for the low-noise expert: its transformer layers go into that transformer (same shapes)
        layers = [LoraLayer(component=ref.component if layer.component == "transformer" else layer.component,
                            module=layer.module, down=layer.down, up=layer.up, bias=layer.bias,
                            scale=layer.scale * ref.scale)
                  for ref, adapter in prepared for layer in adapter.layers]
        return AdapterSwitch(pipe=pipe, weights=weights, key=key, layers=layers,
                             sha256=tuple(adapter.sha256 for _, adapter in prepared))


@dataclass(frozen=True, slots=True)
class AdapterSwitch:
    """One job's adapter set for one pipeline, ready to switch in."""

    pipe: DiffusionPipeline
    weights: LoraWeights
    key: tuple | None
    """What names the set (None: no adapter)."""
    layers: list[LoraLayer]
    sha256: tuple[str, ...]
    """Each adapter's file sha256, in the job's order."""

    @property
    def needed(self) -> bool:
        """Whether the pipeline holds another set now."""
        return self.weights.active != self.key

    def apply(self) -> None:
        self.weights.switch(self.pipe, self.key, self.layers)
