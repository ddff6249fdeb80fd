"""`gen plan` through click's CliRunner: the table, the JSON schema, and argument errors."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.exit_codes import USAGE

LAYOUT_KEYS = {"layout", "dp", "cfg", "distrifusion", "pp", "ring", "ulysses", "tp", "fsdp", "vae_parallel"}
ESTIMATE_KEYS = {"seconds_per_job", "seconds_per_step", "jobs_per_hour", "memory_per_rank_gib", "comm_bytes_per_step"}


def _gen(*args: str):
    return CliRunner().invoke(main, ["plan", *args])


def _json(*args: str) -> dict:
    result = _gen(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_schema_best_first_with_rejections():
    data = _json("--model", "wan2.1-14b", "--gpus", "8", "--objective", "latency")
    assert data["schema"] == 9 and data["model"] == "wan2.1-14b" and data["objective"] == "latency"
    assert data["profile"] is None
    assert data["workload"] == {"width": 1280, "height": 720, "frames": 81, "steps": 50, "tokens": 75600,
                                "image_tokens": 75600, "offload_text_encoder": False, "batch_size": 1,
                                "quantization": "none", "quantize_text_encoder": False, "encode": None}
    assert data["cluster"]["gpu"] == "h100" and data["cluster"]["gpus"] == 8 and data["cluster"]["network"] is None
    layouts = data["layouts"]
    for layout in layouts:
        assert LAYOUT_KEYS | ESTIMATE_KEYS | {"vae_decode", "breakdown", "explain"} == set(layout)
        group = 8 // layout["dp"]  # Wan's VAE decodes patch-parallel over a group of two or more
        assert (layout["vae_decode"], layout["vae_parallel"]) == (("parallel", group) if group > 1 else ("full", 1))
        degrees = [layout[axis] for axis in ("dp", "cfg", "distrifusion", "pp", "ring", "ulysses", "tp")]
        assert math.prod(degrees) == 8
        parts = layout["breakdown"]
        assert set(parts["memory_gib"]) >= {"weights", "activations", "stale_kv", "vae_decode", "total"}
        assert sum(parts["comm_bytes_per_step"].values()) == pytest.approx(layout["comm_bytes_per_step"], abs=10)
        assert layout["jobs_per_hour"] == pytest.approx(layout["dp"] * 3600 / layout["seconds_per_job"], rel=1e-3)
        _check_explanation(layout)
    exact = [layout["seconds_per_job"] for layout in layouts if layout["pp"] == layout["distrifusion"] == 1]
    assert exact == sorted(exact)
    assert {key: layouts[0][key] for key in LAYOUT_KEYS} == data["best"]
    assert data["best"]["cfg"] == 2 and data["best"]["ulysses"] == 4
    for r in data["rejected"]:  # those too big for memory (DistriFusion's K/V here) name the overage and a fix
        assert set(r) - {"over", "fix", "quantization_fix"} == LAYOUT_KEYS | {"reasons"} and r["reasons"]
        assert ("over" in r) == ("fix" in r)
    stale = [r for r in data["rejected"] if r["distrifusion"] > 1 and r["cfg"] == 1]
    assert stale and all(any("61.9 GB per CFG branch x 2" in reason for reason in r["reasons"]) for r in stale)
    json.dumps(data, allow_nan=False)


def test_json_memory_rejections_give_the_number_and_the_fastest_fix():
    # 40 GiB GPUs: one rank holds HunyuanVideo's weights and encoders (40.5 GiB) and more
    data = _json("-m", "hunyuanvideo", "-g", "4", "--gpu-mem", "40")
    too_big = [r for r in data["rejected"] if "over" in r]
    assert too_big and data["best"] is not None
    for rejection in too_big:
        over, fix = rejection["over"], rejection["fix"]
        assert over["needs_gib"] > over["limit_gib"] == 40 and over["part"] in ("weights", "text_encoder",
                                                                            "activations", "vae_decode")
        said = re.search(r"needs ([\d.]+) GiB per rank > 40\.00 GiB", rejection["reasons"][0])
        # the text rounds the peak to 2 decimals, the JSON to 3: the same number either way
        assert said and float(said.group(1)) == pytest.approx(over["needs_gib"], abs=0.006)
        if fix is not None:
            assert fix["memory_per_rank_gib"] <= 40 and fix["change"] in rejection["reasons"][0]
            ranked = {layout["layout"]: layout for layout in data["layouts"]}
            assert fix["seconds_per_job"] == pytest.approx(ranked[fix["layout"]]["seconds_per_job"], rel=1e-3) \
                or fix["decode"] != ranked.get(fix["layout"], {}).get("vae_decode")
    single = next(r for r in data["rejected"] if r["layout"] == "dp4")
    assert single["fix"]["change"] == "--fsdp" or single["fix"]["layout"] != "dp4"


def _check_explanation(layout: dict) -> None:
    """The terms add up to the estimate, and every active axis names its link, kind, figures and source."""
    why = layout["explain"]
    assert why["profile"] is None and why["inputs"]["steps"] == 50
    assert set(why["terms_s_per_job"]) == {"compute_s", "fixed_s", "exposed_comm_s", "pipeline_s", "encode_s",
                                          "decode_s"}
    assert why["sum_s_per_job"] == pytest.approx(layout["seconds_per_job"], rel=1e-3)
    assert why["terms_s_per_job"]["compute_s"] == pytest.approx(50 * layout["breakdown"]["compute_s_per_step"], rel=1e-3)
    assert why["inputs"]["comm_bytes_per_step"] == layout["breakdown"]["comm_bytes_per_step"]
    assert set(why["parameters"]["communication"]) == set(layout["breakdown"]["links"])
    for axis, figures in why["parameters"]["communication"].items():
        assert figures["link"] == layout["breakdown"]["links"][axis] and figures["source"] == "published"
    assert all(why["parameters"][name]["source"] == "published" for name in ("gemm_tflops", "layer_overhead_s"))


def test_json_throughput_on_two_ethernet_nodes():
    data = _json("-m", "flux.1-dev", "-g", "16", "--nodes", "2", "--interconnect", "ethernet", "--gpu", "l40")
    assert data["cluster"]["network"] == "ethernet" and data["cluster"]["nodes"] == 2
    assert data["best"]["dp"] == 16 and data["layouts"][0]["comm_bytes_per_step"] == 0


def test_table_shows_the_why():
    result = _gen("--model", "flux.1-dev", "--gpus", "8", "--gpu", "l40", "--objective", "latency", "--top", "4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "flux.1-dev 1024x1024 28 steps x 1 branch (4608 tokens)"
    header = lines[3].split()
    for column in ("dp", "uly", "pp", "fsdp", "s/job", "s/step", "jobs/h", "compute", "exposed", "GB/step", "GiB/rank"):
        assert column in header
    assert "not in the runner yet" not in result.output  # every axis runs, PipeFusion's too
    assert any(line.startswith("best runnable: ") for line in lines)
    assert any(line.startswith("rejected ") for line in lines)
    assert "more legal layouts" in result.output and "only when 10% faster" in result.output


def test_size_and_memory_options_change_the_plan():
    small = _json("-m", "wan2.1-1.3b", "-g", "8", "--width", "480", "--height", "480", "--frames", "33",
                  "--steps", "10")
    assert small["workload"]["tokens"] == 9 * 30 * 30 and small["best"]["dp"] == 8
    tight = _json("-m", "wan2.1-1.3b", "-g", "8", "--gpu-mem", "16")
    assert tight["best"]["dp"] < 8 and tight["cluster"]["gpu_mem_gib"] == 16
    latency = _json("-m", "flux.1-dev", "-g", "8", "--max-latency", "2")
    assert latency["best"]["dp"] == 2 and all(layout["seconds_per_job"] <= 2 for layout in latency["layouts"])


def test_vae_decode_option_prices_every_layout_in_that_mode_and_the_table_names_it():
    tiled = _json("-m", "hunyuanvideo", "-g", "2", "--vae-decode", "tiled")
    assert {layout["vae_decode"] for layout in tiled["layouts"]} == {"tiled"}
    assert all(layout["explain"]["inputs"]["vae_decode"] == "tiled" for layout in tiled["layouts"])
    # 720p 129 frames: the exact full decode needs 69 GiB in fp32 (the runner's video VAE), 110 GiB per rank in
    # all: auto decodes exact where that fits (an H200's 140 GiB) and tiles where it does not (an H100's 80)
    auto = _json("-m", "hunyuanvideo", "-g", "2", "--gpu", "h200")
    assert {layout["vae_decode"] for layout in auto["layouts"]} == {"full"}  # exact, since it fits
    small = _json("-m", "hunyuanvideo", "-g", "2")
    assert {layout["vae_decode"] for layout in small["layouts"]} == {"tiled"}
    table = _gen("-m", "hunyuanvideo", "-g", "4", "--gpu-mem", "40").output
    assert "decode" in table.splitlines()[3] and "fits with --fsdp" in table
    assert _gen("-m", "hunyuanvideo", "-g", "2", "--vae-decode", "patch").exit_code == USAGE


def test_no_runnable_layout_still_prints_the_plan():
    data = _json("-m", "wan2.1-14b", "-g", "1", "--gpu-mem", "24")  # not even with fp8 weights
    assert data["best"] is None and data["layouts"] == [] and "GiB per rank" in data["rejected"][0]["reasons"][0]
    assert data["rejected"][0]["fix"] is None and "use more GPUs" in data["rejected"][0]["reasons"][0]
    assert data["rejected"][0]["quantization_fix"] is None
    assert "no runnable layout" in _gen("-m", "wan2.1-14b", "-g", "1", "--gpu-mem", "24").output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope", "--gpus", "8"], "published model"),
        (["--model", "flux.1-dev", "--gpus", "8", "--nodes", "3"], "cannot be spread evenly"),
        (["--model", "flux.1-dev", "--gpus", "8", "--frames", "9"], "applies to video models"),
        (["--model", "flux.1-dev", "--gpus", "8", "--interconnect", "ethernet"], "--nodes 2 or more"),
    ],
)
def test_bad_arguments_exit_with_usage(args, message):
    result = _gen(*args)
    assert result.exit_code == USAGE and message in result.output


def test_click_rejects_unknown_choices():
    assert _gen("--model", "flux.1-dev", "--gpus", "8", "--gpu", "k80").exit_code == 2
    assert _gen("--model", "flux.1-dev", "--gpus", "8", "--objective", "fast").exit_code == 2
