"""Text encoders whose saved keys differ from their module names, under `--text-encoder-parallel tp`.

transformers 5 saves Qwen2.5-VL (Qwen-Image's text encoder) in its older layout (`model.layers.*`, `visual.*`)
and renames the keys on loading (`model.language_model.layers.*`, `model.visual.*`). The shard reader maps the
module's names to those keys by transformers' own rules, so each rank reads only its part: on two gloo ranks at
tp 2 from a saved tiny Qwen-Image directory, every rank's bytes read from the text encoder's safetensors equal
its own parts' bytes (half of each split tensor, the rest whole; nothing read twice, nothing through
`from_pretrained`), and the prompt embeddings equal one process's. One process: the mapping itself (renamed,
identical, a converted key left out) and the logged whole-load fallback of an encoder saved without safetensors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections import Counter
from unittest import mock

import pytest
import torch

from genbatch.models import resolve_model
from genbatch.parallel.tensor.checkpoint import checkpoint_names, missing_from, weight_map, whole_load_reason
from genbatch.runner.loading import empty_component, load_pipeline
from genbatch.runner.loading import load_for_group
from tests.parallel.test_tensor_loading import _save
from tests.support.distributed import run_on_ranks
from tests.support.runs import job_executor

PROMPTS = ["a red fox in the snow", "an owl"]


@pytest.fixture(scope="module")
def qwen_image(tmp_path_factory) -> str:
    """A saved tiny Qwen-Image pipeline (fp32 safetensors), its text encoder's MLP 38 wide (two ranks divide it)."""
    path = str(tmp_path_factory.mktemp("renamed") / "tiny-qwen-image")
    _save(load_pipeline(resolve_model("tiny-qwen-image"), torch.device("cpu"), torch.float32), path)
    return path


class _CountedSlice:
    """A safetensors slice whose reads add their bytes to `counts[folder]`."""

    def __init__(self, part, counts: Counter, folder: str):
        self._part, self._counts, self._folder = part, counts, folder

    def __getitem__(self, index):
        tensor = self._part[index]
        self._counts[self._folder] += tensor.numel() * tensor.element_size()
        return tensor

    def __getattr__(self, name):
        return getattr(self._part, name)


class _CountedFile:
    """An open safetensors file whose tensor reads (whole or sliced) are counted per folder."""

    def __init__(self, handle, counts: Counter, folder: str):
        self._handle, self._counts, self._folder = handle, counts, folder

    def get_tensor(self, name):
        tensor = self._handle.get_tensor(name)
        self._counts[self._folder] += tensor.numel() * tensor.element_size()
        return tensor

    def get_slice(self, name):
        return _CountedSlice(self._handle.get_slice(name), self._counts, self._folder)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


@contextlib.contextmanager
def counted_reads():
    """Bytes read from safetensors per folder, by genbatch's shard reader and by transformers' `from_pretrained`."""
    import safetensors
    import transformers.modeling_utils

    real, counts = safetensors.safe_open, Counter()

    def safe_open(path, *args, **kwargs):
        return _CountedFile(real(path, *args, **kwargs), counts, os.path.dirname(os.path.abspath(path)))

    with mock.patch.object(safetensors, "safe_open", safe_open), \
            mock.patch.object(transformers.modeling_utils, "safe_open", safe_open):
        yield counts


def _stored_bytes(folder: str) -> int:
    from safetensors.torch import load_file

    return sum(tensor.numel() * tensor.element_size() for path in set(weight_map(folder).values())
               for tensor in load_file(path).values())


def _load_and_encode(rank, world_size, path, out, layout=None):
    """This rank's prompt embeddings from the pipeline laid out by `layout` (tp 2), its bytes read from the text
    encoder's files, the bytes of its own parts (stored fp32) and how many of the encoder's parameters are split."""
    from torch.distributed.tensor import DTensor

    folder = os.path.join(path, "text_encoder")
    layout = layout or {"tp": 2}
    with counted_reads() as counts, job_executor(out, text_encoder_parallel="tp", **layout) as (world, _):
        with mock.patch("genbatch.runner.loading.load_pipeline", side_effect=AssertionError("loaded whole")):
            pipe = load_for_group(resolve_model(path), world.ctx, world.dtype, world.parallelize)
        read = counts[os.path.abspath(folder)]
    encoder = pipe.text_encoder
    params = list(encoder.parameters())
    own = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * 4 for p in params)
    split = sum(isinstance(p, DTensor) for p in params)
    if "tp" not in layout:  # Wan's encode_prompt: the embeddings only
        return pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, device=world.ctx.device)[0], None, \
            read, own, split
    embeds, mask = pipe.encode_prompt(PROMPTS, device=world.ctx.device)
    return embeds, mask, read, own, split


def test_qwen_image_encoder_tp2_reads_only_each_ranks_part_and_embeds_as_one_process(qwen_image, tmp_path):
    whole = load_pipeline(resolve_model(qwen_image), torch.device("cpu"), torch.float32)
    ref_embeds, ref_mask = whole.encode_prompt(PROMPTS, device=torch.device("cpu"))
    stored = _stored_bytes(os.path.join(qwen_image, "text_encoder"))
    for rank, (embeds, mask, read, own, split) in enumerate(
            run_on_ranks(_load_and_encode, 2, args=(qwen_image, str(tmp_path)), timeout_s=60)):
        assert split >= 8, f"rank {rank}: the plan split {split} of the encoder's parameters"
        assert read == own, f"rank {rank} read {read} bytes of the text encoder, its parts hold {own}"
        assert read < 0.9 * stored, f"rank {rank} read {read} of {stored} stored bytes"
        assert torch.equal(mask, ref_mask)
        assert (embeds - ref_embeds).abs().max() <= 1e-5, f"rank {rank}"


def test_the_module_names_map_to_the_keys_transformers_saved(qwen_image):
    folder = os.path.join(qwen_image, "text_encoder")
    encoder = empty_component(qwen_image, "text_encoder", torch.float32)
    keys = weight_map(folder)
    names = checkpoint_names(encoder, keys)
    assert names["model.language_model.layers.0.self_attn.q_proj.weight"] == "model.layers.0.self_attn.q_proj.weight"
    assert names["model.visual.patch_embed.proj.weight"] == "visual.patch_embed.proj.weight"
    assert names["lm_head.weight"] == "lm_head.weight"
    assert sorted(names.values()) == sorted(keys)  # every stored tensor, each once
    assert missing_from(encoder, folder) == [] and whole_load_reason(encoder, folder) is None
    # a model of another library keeps its names; a key transformers converts on loading is no plain read
    assert checkpoint_names(torch.nn.Linear(2, 2), ["weight", "bias"]) == {"weight": "weight", "bias": "bias"}
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import Chunk, WeightConverter

    fused = WeightConverter(source_patterns=r"mlp\.gate_up_proj\.weight",
                            target_patterns=[r"mlp.gate_proj.weight", r"mlp.up_proj.weight"], operations=[Chunk(dim=0)])
    stored = {key.replace("mlp.gate_proj.weight", "mlp.gate_up_proj.weight"): file for key, file in keys.items()
              if not key.endswith("mlp.up_proj.weight")}
    with mock.patch("transformers.conversion_mapping.get_model_conversion_mapping",
                    return_value=[fused, *get_model_conversion_mapping(encoder)]):
        converted = checkpoint_names(encoder, stored)
    assert "model.language_model.layers.0.mlp.gate_proj.weight" not in converted
    assert converted["model.language_model.layers.0.mlp.down_proj.weight"] == "model.layers.0.mlp.down_proj.weight"


def test_an_encoder_saved_without_safetensors_loads_whole_saying_so(qwen_image, tmp_path, caplog):
    import shutil

    from safetensors.torch import load_file

    from genbatch.runner.loading import _split_encoders

    path = str(tmp_path / "bin")
    shutil.copytree(os.path.join(qwen_image, "text_encoder"), os.path.join(path, "text_encoder"))
    shutil.copy(os.path.join(qwen_image, "model_index.json"), path)
    stored = os.path.join(path, "text_encoder", "model.safetensors")
    torch.save(load_file(stored), os.path.join(path, "text_encoder", "pytorch_model.bin"))
    os.remove(stored)
    ctx = types.SimpleNamespace(group=types.SimpleNamespace(size=2), dims=types.SimpleNamespace(fsdp=False), rank=0)
    with caplog.at_level(logging.WARNING, logger="genbatch.runner.loading"):
        assert _split_encoders(path, ctx, torch.float32, "tp") == {}
    assert "text_encoder (Qwen2_5_VLForConditionalGeneration) loads whole on every rank" in caplog.text
    assert "holds no safetensors" in caplog.text and "safe_serialization=True" in caplog.text
    assert _split_encoders(qwen_image, ctx, torch.float32, "tp").keys() == {"text_encoder"}  # read in parts


@pytest.mark.parametrize("layout", [{"ulysses": 2}, pytest.param({"ulysses": 2, "fsdp": True})],
                         ids=["ulysses2", "ulysses2-fsdp"])
def test_without_tp_an_encoder_split_over_the_group_is_read_in_parts_too(layout, tmp_path):
    path = str(tmp_path / "tiny-wan")
    _save(load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32), path)
    whole = load_pipeline(resolve_model(path), torch.device("cpu"), torch.float32)
    reference = whole.encode_prompt(PROMPTS, do_classifier_free_guidance=False, device=torch.device("cpu"))[0]
    stored = _stored_bytes(os.path.join(path, "text_encoder"))
    for rank, (embeds, _, read, own, split) in enumerate(run_on_ranks(
            _load_and_encode, 2, args=(path, str(tmp_path / "out"), layout), timeout_s=60)):
        assert split >= 8 and read == own and read < 0.9 * stored, (rank, split, read, own, stored)
        assert (embeds - reference).abs().max() <= 1e-5, f"rank {rank}"
