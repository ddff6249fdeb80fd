"""Quantized outputs against the unquantized ones, on the same rows: fp8 and int8 stay far closer to bf16 than
another seed's bf16 output is (by `MARGIN_DB` at least), scored as gen bench scores them (PSNR, SSIM); and
`gen bench --quantization` scores every layout against one unquantized run, says "quantized" beside the numbers,
and its nightly comparison judges a PSNR drop as it judges a slowdown."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from genbatch.benchmark.quality import psnr, ssim
from genbatch.models.hooks import to_uint8
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor, run_cli

MARGIN_DB = 5.0
"""How much closer to bf16 (PSNR, dB) a quantized output must be than another seed's bf16 output. Measured on
tiny-wan in bf16 (64x48, 9 frames, 4 steps): fp8 36.6 dB, int8 39.4 dB, another seed 26.1 dB; on a 280M random
Wan transformer (diffusers + torchao, 64x64, 5 frames, 2 steps): 31.0, 33.1 and 26.2 dB."""


def test_fp8_and_int8_outputs_are_closer_to_bf16_than_another_seed_is(tmp_path):
    row = job("tiny-wan", num_inference_steps=4, seed=1000)
    frames = {}
    for kind in ("none", "fp8", "int8"):
        with job_executor(str(tmp_path / kind), quantization=kind, dtype="bf16") as (world, executor):
            frames[kind] = to_uint8(drive.generate(executor, row, JobTimer(world.ctx.device)))
            if kind == "none":
                frames["seed"] = to_uint8(drive.generate(executor, replace(row, seed=1001), JobTimer(world.ctx.device)))
    bf16 = frames["none"]
    scores = {name: (psnr(frames[name], bf16, 255), ssim(frames[name], bf16, 255)) for name in ("fp8", "int8", "seed")}
    print(scores)
    for kind in ("fp8", "int8"):
        assert scores[kind][0] > scores["seed"][0] + MARGIN_DB, scores
        assert scores[kind][1] > scores["seed"][1], scores
    assert scores["int8"][0] > scores["fp8"][0]  # 7 bits of mantissa-equivalent against fp8's 3


@pytest.mark.slow  # two gen bench nights and their unquantized references (four runs): 20 s on a quiet machine
def test_gen_bench_scores_quantized_nights_against_the_unquantized_run_and_compares_them(tmp_path):
    from genbatch.benchmark.quality import PSNR_CAP_DB, output_quality

    models = str(tmp_path / "models")
    nights = {}
    for kind, baseline in (("int8", ()), ("fp8", ("--baseline", str(tmp_path / "int8")))):
        result = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", str(tmp_path / kind),
                         "--model-cache", models, "--dtype", "bf16", "--quantization", kind, *baseline)
        nights[kind] = (result, json.loads((tmp_path / kind / "quality.json").read_text())["single"])
        report = (tmp_path / kind / "report.md").read_text()
        assert f"quantized weights {kind}" in report and f"| quantized {kind} |" in report, report
        assert "## Quality against the exact configuration" in report
        run = json.loads((tmp_path / kind / "exact" / "runs" / "single" / "run.json").read_text())
        assert run["quantization"] == "none" and run["dtype"] == "bfloat16"  # the reference: bf16 weights
        ours = json.loads((tmp_path / kind / "runs" / "single" / "run.json").read_text())
        assert ours["quantization"] == kind
    # another seed's (and prompt's) bf16 output: the exact run's two rows against each other
    exact = tmp_path / "int8" / "exact" / "runs" / "single" / "outputs"
    from genbatch.io import decode_mp4

    first, second = (decode_mp4(path.read_bytes()) for path in sorted(exact.iterdir()))
    apart = psnr(first, second, 255)
    for kind, (result, scores) in nights.items():
        assert scores["jobs"] == 2 and apart + MARGIN_DB < scores["psnr_db"] < PSNR_CAP_DB, (kind, scores, apart)
        assert scores["approximation"] == f"quantized {kind}"
    fp8_result, fp8 = nights["fp8"]
    int8 = nights["int8"][1]
    assert "psnr_db" in fp8_result.stderr  # the comparison with the int8 night names the quality
    regressed = fp8["psnr_db"] < int8["psnr_db"] - 1.0
    assert (fp8_result.returncode == 3) is regressed and ("REGRESSION" in fp8_result.stderr) is regressed
    assert output_quality(str(tmp_path / "fp8" / "exact" / "runs" / "single"),
                          str(tmp_path / "fp8" / "runs" / "single"))["psnr_db"] == pytest.approx(fp8["psnr_db"])
