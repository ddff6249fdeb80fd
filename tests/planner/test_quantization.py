"""The planner under `--quantization`: weights (and FSDP's all-gathers of them) at the quantized width, the text
encoders too with `--quantize-text-encoder`, the linear layers at the FP8 rate only on GPUs that run FP8 GEMMs,
a memory rejection that names `--quantization fp8` (or `--quantize-text-encoder`) where that makes the job fit,
and no layout the runner refuses beside a quantization (tp, FSDP). The rule is the shape's parameter counts times
the width, for any model: the largest published family here (Qwen-Image, 20B + an 8B encoder) and a shape with
FLUX.2 [dev]'s published counts (32B + Mistral Small 3.1's 24B) show the same."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genbatch.jobs.quantization import Quantization
from genbatch.parallel.formulas import StepShape, bytes_per_step
from genbatch.planner.rank import plan
from genbatch.planner.shapes import PUBLISHED
from tests.support.runs import run_cli

FP8, INT8 = Quantization(kind="fp8"), Quantization(kind="int8")
FP8_ALL = Quantization(kind="fp8", text_encoders=True)
GIB = 2**30
FLUX2_DEV = replace(PUBLISHED["flux.1-dev"], name="flux.2-dev-counts", parameters=32.2e9, text_encoder_parameters=24.0e9,
                    num_layers=8 + 48, num_heads=48, head_dim=128, ffn_dim=18432, text_tokens=512)
"""FLUX.2 [dev]'s published sizes on FLUX.1's record (the family itself lands elsewhere): what the rule reads."""


def _single(model, quantization=None, gpu="h100", **options):
    return plan(model, 1, gpu=gpu, gpu_mem=500, quantization=quantization, **options).ranked[0].estimate


def test_weights_take_the_quantized_width_and_the_encoders_only_when_asked():
    shape = PUBLISHED["wan2.1-14b"]
    bf16, fp8, both = (_single("wan2.1-14b", q).memory for q in (None, FP8, FP8_ALL))
    assert bf16["weights"] == pytest.approx(shape.parameters * 2 / GIB)
    assert fp8["weights"] == pytest.approx(bf16["weights"] / 2) and fp8["text_encoder"] == bf16["text_encoder"]
    assert both["text_encoder"] == pytest.approx(bf16["text_encoder"] / 2)
    assert _single("wan2.1-14b", INT8).memory["weights"] == fp8["weights"]


def test_fsdp_all_gathers_at_the_weights_width():
    shape = StepShape(tokens=1024, width=512, layers=4, parameters=10**6, prediction_values=100, value_bytes=2)
    full = bytes_per_step(shape, cfg=1, ring=1, ulysses=2, fsdp=True, uses_cfg=False)["fsdp_all_gather"]
    half = bytes_per_step(replace(shape, weight_bytes=1), cfg=1, ring=1, ulysses=2, fsdp=True,
                          uses_cfg=False)["fsdp_all_gather"]
    assert half == full / 2 == 10**6 / 2  # (g-1)/g P e with g = 2, e = 1


def test_fp8_runs_the_linear_layers_at_the_fp8_rate_only_where_fp8_gemms_run():
    for gpu, faster in (("h100", True), ("l40s", True), ("a100", False)):
        bf16, fp8, int8 = (_single("flux.1-dev", q, gpu=gpu) for q in (None, FP8, INT8))
        assert int8.compute_s == pytest.approx(bf16.compute_s)  # weight-only: bf16 GEMMs
        assert (fp8.compute_s < 0.8 * bf16.compute_s) is faster, gpu
        assert faster or fp8.compute_s == pytest.approx(bf16.compute_s)


def test_a_memory_rejection_names_fp8_where_it_makes_the_job_fit():
    result = plan("wan2.1-14b", 1, gpu_mem=40)
    (rejection,) = result.rejected
    assert rejection.quantization_fix.change == "--quantization fp8"
    assert "fits with --quantization fp8 (single" in rejection.reasons[0]
    assert plan("wan2.1-14b", 1, gpu_mem=40, quantization=FP8).ranked  # and it does fit
    # beside a layout change that fits too: both are named
    wide = {r.layout.name: r for r in plan("wan2.1-14b", 2, gpu_mem=40).rejected}["dp2"]
    assert wide.fix is not None and "; or with --quantization fp8" in wide.reasons[0]


def test_no_layout_the_runner_refuses_is_ranked_or_offered_as_a_fix_beside_a_quantization():
    result = plan("wan2.1-14b", 8, gpu_mem=24, quantization=FP8)
    layouts = [c.layout for c in result.ranked] + [r.layout for r in result.rejected]
    assert layouts and not any(layout.tp > 1 or layout.fsdp for layout in layouts)
    fixes = [r.fix for r in result.rejected if r.fix is not None]
    assert not any(fix.layout.tp > 1 or fix.layout.fsdp for fix in fixes)
    with pytest.raises(ValueError, match="--tp 2 with --quantization fp8"):
        from genbatch.planner.constraints import LayoutConstraints

        plan("wan2.1-14b", 8, quantization=FP8, constraints=LayoutConstraints(tp=2)).best


def test_the_largest_family_here_fits_one_gpu_with_its_encoder_quantized_and_says_so_without(tmp_path):
    """Qwen-Image (20.4B + Qwen2.5-VL's 8.3B) on one GPU of 32 GiB: fp8 alone leaves the encoder's 15.4 GiB;
    the plan says to quantize it too, and with it ranks a layout."""
    args = ("plan", "--model", "qwen-image", "--gpus", "1", "--gpu-mem", "32", "--quantization", "fp8")
    alone = run_cli(*args)
    assert alone.returncode == 0 and "no runnable layout" in alone.stdout
    assert "text_encoder 15.4" in alone.stdout and "fits with --quantize-text-encoder (single" in alone.stdout
    both = run_cli(*args, "--quantize-text-encoder")
    assert both.returncode == 0 and "best runnable: single" in both.stdout, both.stdout
    assert "fp8 weights (text encoders too)" in both.stdout


@pytest.mark.parametrize("gpu_mem, fits_alone", [(80, True), (72, False)])
def test_the_rule_reads_the_shapes_counts_so_flux2_dev_plans_the_same(gpu_mem, fits_alone):
    """FLUX.2 [dev]'s counts: bf16 needs 108 GiB; fp8 weights 30 GiB beside the 24B encoder's 44.7 (78.4 GiB in
    all: inside 80 GiB, not 72); with the encoder quantized, 56 GiB."""
    bf16 = plan(FLUX2_DEV, 1, gpu_mem=gpu_mem)
    assert not bf16.ranked and "--quantization fp8" in bf16.rejected[0].reasons[0]
    alone = plan(FLUX2_DEV, 1, gpu_mem=gpu_mem, quantization=FP8)
    assert bool(alone.ranked) is fits_alone
    if not fits_alone:
        assert "fits with --quantize-text-encoder" in alone.rejected[0].reasons[0]
    both = plan(FLUX2_DEV, 1, gpu_mem=gpu_mem, quantization=FP8_ALL)
    assert both.ranked[0].layout.name == "single" and both.ranked[0].estimate.memory["total"] < 57
