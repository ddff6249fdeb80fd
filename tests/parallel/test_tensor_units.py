"""Tensor parallelism's pieces on one process: the layout check, the plans resolved on the real diffusers
classes, the split arithmetic, and the refusals that name the fix."""

from __future__ import annotations

import pytest
import torch

from genbatch.models import family
from genbatch.models.base import COLWISE, GATHERED_COLWISE, HEADS, NORM_ACROSS_HEADS, PACKED_ROWWISE, ROWWISE
from genbatch.parallel.dims import ParallelDims
from genbatch.parallel.tensor.shard import resolved_styles, tensor_parallel
from genbatch.parallel.tensor.styles import block_slice, packed_blocks
from genbatch.runner.presets import build_preset


def _plan(preset: str):
    model = build_preset(preset).transformer
    return model, family(preset.removeprefix("tiny-")).transformer_parts(type(model).__name__).tensor_splits


def test_heads_must_divide_by_ulysses_times_tp_and_the_error_names_the_fix():
    ParallelDims(ulysses=2, tp=2).validate(world_size=4, num_heads=4, uses_cfg=True)
    with pytest.raises(ValueError, match=r"--ulysses 2 x --tp 4 = 8 does not divide the model's 4 attention heads"
                                         r".*use --tp one of \[1, 2\]"):
        ParallelDims(ulysses=2, tp=4).validate(world_size=8, num_heads=4, uses_cfg=True)
    with pytest.raises(ValueError, match=r"--ulysses 1 x --tp 3 = 3 does not divide"):
        ParallelDims(tp=3).validate(world_size=3, num_heads=4, uses_cfg=True)


def test_wan_plan_splits_both_attentions_by_heads_and_norms_across_them():
    model, plan = _plan("tiny-wan")
    styles = resolved_styles(model, plan)
    for block in range(len(model.blocks)):
        for attn in ("attn1", "attn2"):
            prefix = f"blocks.{block}.{attn}"
            assert {styles[f"{prefix}.{p}"] for p in ("to_q", "to_k", "to_v")} == {COLWISE}
            assert styles[f"{prefix}.to_out.0"] == ROWWISE and styles[prefix] == HEADS
            assert styles[f"{prefix}.norm_q"] == styles[f"{prefix}.norm_k"] == NORM_ACROSS_HEADS
        assert styles[f"blocks.{block}.ffn.net.2"] == ROWWISE
    assert styles["condition_embedder.time_proj"] == GATHERED_COLWISE
    assert sum(style == ROWWISE for style in styles.values()) == plan.all_reduces_per_forward({"blocks": 2}) == 6


def test_flux_plan_starts_from_diffusers_and_shards_the_modulation_it_keeps_whole():
    model, plan = _plan("tiny-flux")
    styles = resolved_styles(model, plan)
    assert styles["transformer_blocks.0.attn.to_q"] == COLWISE  # diffusers' _tp_plan
    assert styles["single_transformer_blocks.0.proj_out"] == PACKED_ROWWISE
    for name in ("transformer_blocks.0.norm1.linear", "transformer_blocks.0.norm1_context.linear",
                 "single_transformer_blocks.0.norm.linear", "norm_out.linear"):
        assert styles[name] == GATHERED_COLWISE
    # one all-reduce a row-wise module: 4 in a dual-stream block (2 per stream), 1 in a single-stream block
    assert sum(style in (ROWWISE, PACKED_ROWWISE) for style in styles.values()) == 5


def test_sd3_last_block_lacks_the_text_projections_and_the_plan_skips_them():
    model, plan = _plan("tiny-sd3")
    styles = resolved_styles(model, plan)
    last = len(model.transformer_blocks) - 1
    assert "transformer_blocks.0.attn.to_add_out" in styles and "transformer_blocks.0.ff_context.net.2" in styles
    assert f"transformer_blocks.{last}.attn.to_add_out" not in styles and plan.text_free_last_block
    assert styles[f"transformer_blocks.{last}.norm1_context.linear"] == GATHERED_COLWISE  # AdaLayerNormContinuous


def test_packed_split_takes_each_block_apart():
    full = torch.arange(12.0).reshape(1, 12)  # blocks [4, 8]: columns 0-3 (attention), 4-11 (MLP)
    assert block_slice(full, 1, [4, 8], 0, 2).tolist() == [[0, 1, 4, 5, 6, 7]]
    assert block_slice(full, 1, [4, 8], 1, 2).tolist() == [[2, 3, 8, 9, 10, 11]]
    model, _ = _plan("tiny-hunyuan-video")
    proj_out = model.single_transformer_blocks[0].proj_out  # HunyuanVideo sets no blocks: [out, the rest]
    assert packed_blocks(proj_out) == [32, 128]


class _Group:
    """A stand-in tp group of `size` ranks: the divisibility check runs before any collective."""

    def __init__(self, size):
        self.size, self.rank = size, 0


def test_a_tp_that_does_not_divide_is_refused_before_anything_is_split():
    model, plan = _plan("tiny-wan")
    before = model.blocks[0].attn1.to_q.weight
    with pytest.raises(ValueError, match=r"--tp 3 does not divide WanTransformer3DModel: blocks.0.attn1 has 4 "
                                         r"heads.*choose a degree that divides the head count"):
        tensor_parallel(model, plan, _Group(3), mesh=None)
    assert model.blocks[0].attn1.to_q.weight is before and model.blocks[0].attn1.heads == 4


def test_tp_reaches_gen_run_from_gen_submit_and_gen_bench_and_a_world_it_does_not_divide_exits_2(tmp_path):
    from genbatch.benchmark.execute import SuiteRunner
    from genbatch.benchmark.suites import get_suite
    from tests.support.runs import run_cli, write_manifest

    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "model": "tiny-wan"}])
    result = run_cli("submit", manifest, "--out", str(tmp_path / "run"), "--nodes", "1", "--gpus-per-node", "0",
                     "--procs-per-node", "4", "--ulysses", "2", "--tp", "2", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "--tp 2" in result.stdout[result.stdout.rindex("genbatch run"):]
    runner = SuiteRunner(suite=get_suite("tiny"), manifest_url="m", model_dir="d", out="o", run_args=())
    command = runner.command(ParallelDims(ulysses=2, tp=2))
    assert command[command.index("--tp") + 1] == "2"
    refused = run_cli("run", manifest, "--out", str(tmp_path / "one"), "--tp", "2")
    assert refused.returncode == 2 and "does not divide the world size 1" in refused.stderr
