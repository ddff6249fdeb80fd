"""Quantized weights compose with every layout and feature the runner refuses none of: each 2-rank layout (dp, cfg,
Ulysses, Ring, PipeFusion and DistriFusion with every step synchronous) and each feature on Ulysses (step
caching, batches, compile, LoRA) gives the one-process run's latents under the same quantization (fp32, within
1e-5, as the unquantized layouts do: tests/parallel/test_layouts.py). All of them in one `run_on_ranks` call.
The refused ones (--tp, --fsdp, a quantized text encoder split over the group) stop at start-up with their
reason and fix, from the same rules the planner applies (`parallel/axes.quantization_problems`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from genbatch.jobs.lora import LoraRef
from genbatch.parallel.stale import DISTRIFUSION, PIPEFUSION, StaleConfig
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.lora import peft_lora
from tests.support.runs import job, job_executor, run_cli, write_manifest

STEPS = 3
WAN = job("tiny-wan", width=80, height=48, num_inference_steps=STEPS, negative_prompt="blurry", seed=11)
SECOND = replace(WAN, id="second", prompt="a cat on a sofa", seed=12)


def _case(name, kind="int8", stale=None, rows=1, lora=False, cache=None, compile=False, **layout):
    return {"name": name, "kind": kind, "layout": layout, "stale": stale, "rows": rows, "lora": lora,
            "cache": cache, "compile": compile}


ALL_SYNCHRONOUS = {"method": None, "patches": 2, "warmup_steps": STEPS}  # every step exact: one process's output
CASES = [
    _case("dp2", dp=2), _case("cfg2", cfg=2), _case("ulysses2", kind="fp8", ulysses=2), _case("ring2", ring=2),
    _case("pp2", stale=PIPEFUSION, pp=2), _case("distrifusion2", kind="fp8", stale=DISTRIFUSION, distrifusion=2),
    _case("ulysses2 + cache", cache="fbc:0.3", ulysses=2), _case("ulysses2 + batch", rows=2, ulysses=2),
    _case("ulysses2 + compile", compile=True, ulysses=2), _case("ulysses2 + lora", kind="fp8", lora=True, ulysses=2),
]
QUICK = ("pp2", "ulysses2 + lora")
"""The cases `make test` runs (the whole matrix is slow)."""


def _jobs(case: dict, lora: str | None) -> list:
    rows = [WAN, SECOND][:case["rows"]]
    extra = {"cache": case["cache"]} if case["cache"] else {}
    if case["lora"]:
        extra["lora"] = (LoraRef(lora),)
    return [replace(row, **extra) for row in rows]


def _denoised(case: dict, out: str, lora: str | None, *, single: bool = False) -> torch.Tensor:
    layout = {} if single else case["layout"]
    flags = dict(quantization=case["kind"], compile=case["compile"] and not single, compile_backend="aot_eager")
    with job_executor(out, **flags, **layout) as (world, executor):
        if case["stale"] is not None and not single:
            drive.use_stale(executor, StaleConfig(**{**ALL_SYNCHRONOUS, "method": case["stale"]}))
        return drive.denoise_batch(executor, _jobs(case, lora), JobTimer(world.ctx.device))


def _on_rank(rank, world_size, cases, out, lora):
    return [_denoised(case, f"{out}/{index}/rank{rank}", lora) for index, case in enumerate(cases)]


@pytest.fixture(scope="module")
def wan_lora(tmp_path_factory):
    return peft_lora("tiny-wan", tmp_path_factory.mktemp("wan-lora"), ("to_q", "to_v", "net.0.proj"))


def _check(cases, tmp_path, lora):
    per_rank = run_on_ranks(_on_rank, 2, args=(cases, str(tmp_path / "ranks"), lora), timeout_s=120)
    for index, case in enumerate(cases):
        reference = _denoised(case, str(tmp_path / f"single{index}"), lora, single=True)
        for rank, results in enumerate(per_rank):
            diff = (results[index] - reference).abs().max().item()
            assert diff <= 1e-5, f"{case['name']} ({case['kind']}): rank {rank} latents differ by {diff}"


def test_quantized_two_rank_layouts_equal_one_process(wan_lora, tmp_path):
    _check([case for case in CASES if case["name"] in QUICK], tmp_path, wan_lora)


@pytest.mark.slow  # every 2-rank layout and feature under a quantization: a minute on a quiet machine
def test_every_quantized_two_rank_layout_and_feature_equals_one_process(wan_lora, tmp_path):
    _check(CASES, tmp_path, wan_lora)


@pytest.mark.parametrize("flags, reason", [
    (("--tp", "2"), "--tp 2 with --quantization fp8: torchao's quantized weights"),
    (("--ulysses", "2", "--fsdp"), "--fsdp with --quantization fp8: torchao's quantized weights"),
    (("--quantize-text-encoder", "--text-encoder-parallel", "tp"), "--quantize-text-encoder with "
     "--text-encoder-parallel tp: torchao's quantized weights do not split under DTensor"),
])
def test_a_refused_combination_stops_at_start_up_with_its_reason_and_fix(flags, reason, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-wan", "--quantization",
                     "fp8", *flags)
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr and ("drop --fsdp" in result.stderr or "--ulysses or --ring" in result.stderr
                                        or "replicate" in result.stderr), result.stderr
    assert not (tmp_path / "out" / "results").exists()


def test_the_text_encoder_flag_needs_a_quantization(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-wan", "--quantize-text-encoder")
    assert result.returncode == 2 and "add --quantization fp8 or int8" in result.stderr, result.stderr


def test_run_json_records_each_ranks_weight_bytes_and_each_row_the_quantization(tmp_path):
    """`gen run --nproc 2 --ulysses 2 --quantization int8`: run.json's `weights` holds each rank's bytes of the
    transformer and the text encoder as loaded (the transformer quantized, the encoder not), each results row
    and run.json the quantization."""
    import json

    import pyarrow.parquet as pq

    from genbatch.models import resolve_model
    from genbatch.parallel.quantize import weight_bytes
    from genbatch.runner.loading import load_pipeline
    from tests.support.runs import run_cli_on_ranks

    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "seed": 1}])
    out = tmp_path / "out"
    result = run_cli_on_ranks(2, "run", manifest, "--out", str(out), "--model", "tiny-wan", "--ulysses", "2",
                              "--steps", "2", "--quantization", "int8", "-q")
    assert result.returncode == 0, result.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["quantization"] == "int8" and info["options"]["quantization"] == "int8"
    assert [entry["rank"] for entry in info["weights"]] == [0, 1]
    whole = load_pipeline(resolve_model("tiny-wan"), torch.device("cpu"), torch.float32)
    for entry in info["weights"]:
        assert entry["model"] == "tiny-wan" and entry["transformer"] < 0.5 * weight_bytes(whole.transformer)
        assert entry["text_encoders"] == weight_bytes(whole.text_encoder)  # not asked for: as loaded
    assert info["weights"][0]["transformer"] == info["weights"][1]["transformer"]
    rows = pq.read_table(out / "results").to_pylist()
    assert [row["quantization"] for row in rows] == ["int8"]
