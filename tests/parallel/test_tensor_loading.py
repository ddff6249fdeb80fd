"""Tensor-parallel loading from a pipeline directory: each rank reads only its part of every split tensor from the
safetensors, and gets what loading the whole model and then splitting it gives, bit for bit.

One process: the block reads of a (packed) split equal `block_slice` of the full tensor, and the load dtype
follows diffusers' `_keep_in_fp32_modules` rule. Two gloo ranks at tp 2, for saved tiny Wan and tiny FLUX: every
parameter and buffer of the denoiser and of the text encoders `--text-encoder-parallel tp` splits (UMT5, CLIP,
T5) equals the old path's (load whole, then split) in value and dtype, in bf16 (Wan keeps modules in fp32); and
a job's fp32 latents and frames equal one process's by `test_layouts.py`'s criteria (tp 2; marked slow: tp 2 x
ulysses 2 and dp 2 x tp 2 on four ranks, and the tensors of tiny SD3, Qwen-Image, its Qwen2.5-VL encoder saved
under renamed keys included, and HunyuanVideo).
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from safetensors.torch import save_file

from genbatch.models import resolve_model
from genbatch.parallel.tensor.checkpoint import block_indices, load_dtype, missing_from, read_part, weight_map
from genbatch.parallel.tensor.styles import block_slice
from genbatch.runner.loading import load_for_group
from genbatch.runner.loading import load_pipeline
from tests.parallel.test_layouts import FLUX, WAN, _check, _run_job
from tests.support.distributed import run_on_ranks
from tests.support.runs import job_executor

MODELS = {"tiny-wan": WAN, "tiny-flux": FLUX}


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    """Saved tiny Wan and FLUX pipelines (fp32 safetensors), by preset name; Wan's in shards under an index, as
    large checkpoints are published."""
    root = tmp_path_factory.mktemp("saved")
    paths = {}
    for name, shard_size in (("tiny-wan", "200KB"), ("tiny-flux", "10GB")):
        paths[name] = str(root / name)
        pipe = load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32)
        _save(pipe, paths[name], max_shard_size=shard_size)
    assert len(set(weight_map(f"{paths['tiny-wan']}/transformer").values())) > 1
    return paths


@pytest.fixture(scope="module")
def other_directories(tmp_path_factory):
    """Saved tiny SD3, Qwen-Image and HunyuanVideo pipelines, by preset name."""
    root = tmp_path_factory.mktemp("others")
    paths = {name: str(root / name) for name in ("tiny-sd3", "tiny-qwen-image", "tiny-hunyuan-video")}
    for name, path in paths.items():
        _save(load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32), path)
    return paths


def _save(pipe, path: str, **options) -> None:
    """Save `pipe` with its text encoders' MLPs 38 wide (the presets' 37 splits over no group), fresh seeded."""
    for component in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        encoder = getattr(pipe, component, None)
        if encoder is None:
            continue
        config = getattr(encoder.config, "text_config", None) or encoder.config
        setattr(config, next(key for key in ("d_ff", "intermediate_size") if hasattr(config, key)), 38)
        torch.manual_seed(0)
        setattr(pipe, component, type(encoder)(encoder.config).eval())
    pipe.save_pretrained(path, **options)


@pytest.mark.parametrize(("dim", "blocks"), [(0, [8]), (1, [12]), (1, [4, 8])])
@pytest.mark.parametrize("size", [2, 4])
def test_a_rank_reads_only_its_blocks_and_they_equal_the_split_of_the_full_tensor(tmp_path, dim, blocks, size):
    full = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    save_file({"w": full}, str(tmp_path / "model.safetensors"))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        for rank in range(size):
            part = read_part(handle, "w", (dim, blocks), rank, size)
            assert torch.equal(part, block_slice(full, dim, blocks, rank, size))
            assert part.shape[dim] == sum(blocks) // size
        assert torch.equal(read_part(handle, "w", None, 1, size), full)
    assert len(block_indices((8, 12), 1, [4, 8], 0, 2)) == 2  # a packed split reads one block per packed part
    assert weight_map(str(tmp_path)) == {"w": str(tmp_path / "model.safetensors")}


def test_the_load_dtype_follows_diffusers_keep_in_fp32_rule():
    keep = ("norm1", "scale_shift_table")
    assert load_dtype("blocks.0.norm1.weight", torch.float32, torch.bfloat16, keep) == torch.float32
    assert load_dtype("scale_shift_table", torch.float32, torch.bfloat16, keep) == torch.float32
    assert load_dtype("blocks.0.norm12.weight", torch.float32, torch.bfloat16, keep) == torch.bfloat16  # by part
    assert load_dtype("pos_ids", torch.int64, torch.bfloat16, keep) == torch.int64


def test_the_modules_kept_in_fp32_are_diffusers_and_transformers_own():
    from diffusers import WanTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    from genbatch.runner.loading import keep_in_fp32

    with torch.device("meta"):
        t5 = T5EncoderModel(T5Config(vocab_size=8, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2))
        wan = WanTransformer3DModel(num_attention_heads=2, attention_head_dim=4, num_layers=1, ffn_dim=8,
                                    text_dim=8, freq_dim=8)
    assert keep_in_fp32(t5, torch.float16) == ("wo",)  # transformers keeps T5's `wo` in fp32 under fp16 only
    assert keep_in_fp32(t5, torch.bfloat16) == ()
    assert set(keep_in_fp32(wan, torch.bfloat16)) == set(WanTransformer3DModel._keep_in_fp32_modules)


def test_a_folder_without_safetensors_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match="safe_serialization=True"):
        weight_map(str(tmp_path))
    # a text encoder saved so is left to from_pretrained (it loads whole, then splits)
    assert missing_from(torch.nn.Linear(2, 2), str(tmp_path)) == ["weight", "bias"]


def _states(module):
    from torch.distributed.tensor import DTensor

    local = {name: (value.to_local() if isinstance(value, DTensor) else value)
             for name, value in [*module.named_parameters(), *module.named_buffers()]}
    split = sum(isinstance(param, DTensor) for param in module.parameters())
    return local, split


def _differences(label, new, old) -> list[str]:
    problems = [f"{label}: names differ: {sorted(set(new) ^ set(old))}"] if set(new) != set(old) else []
    for key in sorted(set(new) & set(old)):
        if new[key].dtype != old[key].dtype or new[key].shape != old[key].shape:
            problems.append(f"{label} {key}: {new[key].dtype}{tuple(new[key].shape)} vs "
                            f"{old[key].dtype}{tuple(old[key].shape)}")
        elif not torch.equal(new[key], old[key]):
            problems.append(f"{label} {key}: values differ")
    return problems


def _compare_with_the_old_path(rank, world_size, paths, out):
    """Per model: the components read in shards (the denoiser, the text encoders split over the group) against
    loading whole then splitting; returns the differences and, per component, (tensors, split parameters,
    fp32 tensors)."""
    from genbatch.parallel.apply import parallelize_pipeline
    from genbatch.parallel.config import ParallelizeConfig
    from genbatch.runner.loading import _split_encoders

    problems, counts = [], {}
    with job_executor(out, dtype="bf16", tp=2, text_encoder_parallel="tp") as (world, _):
        for name, path in paths.items():
            spec = resolve_model(path)
            read = ("transformer", *_split_encoders(path, world.ctx, world.dtype, "tp"))
            with mock.patch("genbatch.runner.loading.load_pipeline", side_effect=AssertionError("loaded whole")):
                new_pipe = load_for_group(spec, world.ctx, world.dtype, world.parallelize)
            old_pipe = load_pipeline(spec, world.ctx.device, world.dtype)
            parallelize_pipeline(old_pipe, spec, world.ctx, ParallelizeConfig(text_encoders="tp"))
            for component in read:
                new, split = _states(getattr(new_pipe, component))
                problems += _differences(f"{name} {component}", new, _states(getattr(old_pipe, component))[0])
                counts[f"{name} {component}"] = (len(new), split, sum(v.dtype == torch.float32 for v in new.values()))
    return problems, counts


def test_tp2_reads_every_tensor_as_loading_whole_then_splitting_does(directories, tmp_path):
    for problems, counts in run_on_ranks(_compare_with_the_old_path, 2, args=(directories, str(tmp_path)),
                                         timeout_s=60):
        assert problems == []
        # the denoisers, and the text encoders: UMT5 (Wan), CLIP and T5 (FLUX)
        assert set(counts) == {"tiny-wan transformer", "tiny-wan text_encoder", "tiny-flux transformer",
                               "tiny-flux text_encoder", "tiny-flux text_encoder_2"}
        for component, (tensors, split, fp32) in counts.items():
            assert split >= 8, f"{component}: the plan split {split} parameters"
        assert counts["tiny-wan transformer"][2] > 0  # Wan's _keep_in_fp32_modules stay fp32 under bf16


@pytest.mark.slow
def test_tp2_reads_sd3_qwen_image_and_hunyuan_video_as_loading_whole_then_splitting_does(other_directories, tmp_path):
    for problems, counts in run_on_ranks(_compare_with_the_old_path, 2, args=(other_directories, str(tmp_path)),
                                         timeout_s=90):
        assert problems == []
        assert all(split >= 8 for _, split, _ in counts.values()), counts
        # Qwen2.5-VL's files keep an older layout: read through transformers' renaming of its keys
        assert set(counts) == {"tiny-sd3 transformer", "tiny-sd3 text_encoder", "tiny-sd3 text_encoder_2",
                               "tiny-sd3 text_encoder_3", "tiny-qwen-image transformer", "tiny-qwen-image text_encoder",
                               "tiny-hunyuan-video transformer", "tiny-hunyuan-video text_encoder",
                               "tiny-hunyuan-video text_encoder_2"}


def _layouts(rank, world_size, layouts, out):
    return [_run_job(*layout, out=f"{out}/{index}") for index, layout in enumerate(layouts)]


def _equal_to_one_process(directories, tmp_path, world_size, layouts):
    """Run `layouts` ((dp, cfg, ring, ulysses, fsdp, tp) each) of every saved model's job on `world_size` ranks and
    check them against one process loading the same directory."""
    jobs = [dataclasses.replace(MODELS[name], model=path) for name, path in directories.items()]
    references = {spec_job.model: _run_job(spec_job, 1, 1, 1, 1, False, out=str(tmp_path / f"one{index}"))
                  for index, spec_job in enumerate(jobs)}
    runs = [(spec_job, *layout) for spec_job in jobs for layout in layouts]
    _check(runs, run_on_ranks(_layouts, world_size, args=(runs, str(tmp_path / "tp")), timeout_s=90), references)


def test_tp2_jobs_from_a_directory_equal_one_process(directories, tmp_path):
    _equal_to_one_process(directories, tmp_path, 2, [(1, 1, 1, 1, False, 2)])


def test_tp2_with_fsdp_from_a_directory_reads_its_shards_and_equals_one_process(directories, tmp_path):
    # ulysses 2 x tp 2 +fsdp: each rank reads its tp part, FSDP then shards it over the 2 ulysses ranks
    _equal_to_one_process(directories, tmp_path, 4, [(1, 1, 1, 2, True, 2)])


@pytest.mark.slow
def test_tp2_with_ulysses_and_with_dp_from_a_directory_equal_one_process(directories, tmp_path):
    _equal_to_one_process(directories, tmp_path, 4, [(1, 1, 1, 2, False, 2), (2, 1, 1, 1, False, 2)])
