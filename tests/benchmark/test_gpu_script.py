"""bench/gpu.sh at tiny size on the CPU: every step the GPU run takes (install check, the suite report,
genbatch vs diffusers in fresh processes, the ratios), so the script cannot rot between GPU runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tarfile

import pytest

from genbatch.benchmark.suites import SUITES
from tests.support.runs import REPO


@pytest.mark.slow  # the whole GPU script on the CPU, every case: two to three minutes quiet, more under load
@pytest.mark.timeout(900)
def test_gpu_script_runs_both_sides_and_prints_ratios(tiny_report, tmp_path):
    archive = tmp_path.parent / f"{tmp_path.name}-results.tar.gz"  # packed at exit, for copying back
    env = {**os.environ, "GENBATCH_BENCH_RESULTS": str(tmp_path), "OMP_NUM_THREADS": "1",
           "GENBATCH_CACHE": tiny_report.genbatch_cache,  # the tiny model the report's run built
           "GENBATCH_BENCH_ARCHIVE": str(archive)}
    result = subprocess.run(["bash", os.path.join(REPO, "bench", "gpu.sh"), "--device", "cpu", "--tiny"], env=env,
                            capture_output=True, text=True, timeout=840)
    assert result.returncode == 0, result.stdout + result.stderr
    (folder,) = os.listdir(tmp_path)
    assert folder.endswith("-tiny")
    results = tmp_path / folder
    assert (results / "suite" / "report.md").is_file() and not (results / "suite" / "runs").exists()
    summary = json.loads((results / "versus" / "versus.json").read_text())
    suite = SUITES["tiny"]
    assert summary["jobs"] == suite.jobs and summary["work"]["num_inference_steps"] == suite.num_inference_steps
    for side in ("genbatch", "diffusers"):
        side_result = json.loads((results / "versus" / f"{side}-0" / f"{side}.json").read_text())
        assert len(side_result["step_periods"]) == suite.jobs * (suite.num_inference_steps - 1)
        assert summary[side]["seconds_per_step"] > 0 and summary[side]["peak_bytes"] > 0
    for key, ratio in summary["ratios"].items():
        assert math.isfinite(ratio) and ratio > 0, key
    assert "seconds per step" in result.stdout and "peak memory GiB" in result.stdout and "x" in result.stdout
    assert (results / "versus" / "versus.md").read_text().count("genbatch") >= 2
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    assert f"{folder}/versus/versus.json" in names and f"{folder}/suite/report.md" in names
    assert not [name for name in names if name.endswith(".mp4")]  # results, not videos
    compiled = json.loads((results / "versus-compiled" / "versus.json").read_text())
    assert compiled["compile"] == "aot_eager" and compiled["ratios"]["seconds_per_step"] > 0
    assert json.loads((results / "versus-math" / "versus.json").read_text())["attention"] == "math"
    assert "compile: aot_eager (diffusers: compile_repeated_blocks)" in result.stdout
    # the image case: FLUX, eager and compiled, against FluxPipeline.__call__
    for folder_name, compile in (("versus-flux", None), ("versus-flux-compiled", "aot_eager")):
        flux = json.loads((results / folder_name / "versus.json").read_text())
        assert flux["pipeline"] == "FluxPipeline" and flux["compile"] == compile, folder_name
        assert flux["work"]["num_frames"] is None and flux["ratios"]["seconds_per_step"] > 0, folder_name
        side_result = json.loads((results / folder_name / "genbatch-0" / "genbatch.json").read_text())
        assert len(side_result["step_periods"]) == SUITES["tiny-flux"].jobs * (SUITES["tiny-flux"].num_inference_steps - 1)
    assert "genbatch vs diffusers FluxPipeline.__call__" in result.stdout
    assert "bench/gpu.sh: step 5 took" in result.stderr
    # batched rows: jobs per hour at batch 1 and 2, with the ratio
    batching = (results / "batching.txt").read_text()
    assert "tiny-flux N=1:" in batching and "tiny-flux N=2:" in batching and "vs N=1" in batching
    assert "bench/gpu.sh: step 6 took" in result.stderr
    # genbatch vs diffusers' own parallelism, standing in for one GPU: the one-process pairings ran, and every
    # multi-rank layout is printed as not run, with why
    parallel = json.loads((results / "versus-parallel" / "versus_parallel.json").read_text())
    for family in ("wan", "flux"):
        records = {record["layout"]: record for record in parallel["families"][family]["layouts"]}
        one = records.pop("one process")
        assert one["ratios"]["seconds_per_step"] > 0 and one["genbatch"]["psnr_db"] is not None, family
        assert records and all("not_run" in record for record in records.values()), family
    assert "ulysses 2: not run on either side: needs 2 ranks" in result.stdout
    assert "bench/gpu.sh: step 7 took" in result.stderr
    # quantized weights: each suite's variants against its unquantized run, with the media left out
    quantized = json.loads((results / "quantization" / "quantization.json").read_text())
    assert set(quantized) == {"tiny", "tiny-flux"}
    for name, suite_result in quantized.items():
        variants = suite_result["variants"]
        assert set(variants) == {"none", "fp8", "fp8-compiled"}, name
        assert variants["fp8"]["method"] == "fp8 weight-only" and variants["fp8-compiled"]["compiled"] == "yes"
        assert all(v["seconds_per_step"] > 0 and v["peak_bytes"] > 0 for v in variants.values()), name
        assert 20 < variants["fp8"]["psnr_db"] < 100 and variants["none"]["psnr_db"] >= 100, name
    assert "| fp8-compiled | fp8 weight-only |" in (results / "quantization" / "quantization.md").read_text()
    assert not list((results / "quantization").glob("*/*/run/outputs"))
    assert "bench/gpu.sh: step 8 took" in result.stderr
