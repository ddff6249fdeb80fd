"""bench/versus_parallel.py at tiny size: genbatch's layouts against diffusers' own `enable_parallelism` on the
same rows and ranks (gloo, 2 processes, 1 round), both sides measured, the ratios and PSNRs printed and written,
and a layout diffusers refuses printed with its own error."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.support.runs import REPO


@pytest.mark.slow  # six launches of fresh interpreters (two of them 2-rank torchrun groups): a minute or two
def test_versus_parallel_runs_both_sides_and_prints_ratios(tmp_path):
    out = tmp_path / "versus"
    command = [sys.executable, os.path.join(REPO, "bench", "versus_parallel.py"), "--scale", "tiny", "--families",
               "wan", "--layouts", "ulysses 2,ring 2", "--rounds", "1", "--jobs", "1",
               "--model-cache", str(tmp_path / "cache"), "--out", str(out)]
    result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    summary = json.loads((out / "versus_parallel.json").read_text())
    layouts = {record["layout"]: record for record in summary["families"]["wan"]["layouts"]}
    assert list(layouts) == ["one process", "ulysses 2", "ring 2"]
    for name in ("one process", "ulysses 2"):
        record = layouts[name]
        for side in ("genbatch", "diffusers"):
            numbers = record[side]
            assert numbers["seconds_per_step"] > 0 and numbers["seconds_per_job"] > 0, (name, side)
            assert numbers["peak_bytes"] > 0 and numbers["psnr_db"] is not None, (name, side)
            ranks = sorted(os.listdir(out / "wan" / name.replace(" ", "-") / f"{side}-0"))
            assert [r for r in ranks if r.startswith("rank-")] == [f"rank-{i}.json" for i in range(record["ranks"])]
        for key in ("seconds_per_step", "seconds_per_job", "peak_bytes"):
            assert math.isfinite(record["ratios"][key]) and record["ratios"][key] > 0, (name, key)
    # the tiny model at one process and under Ulysses: the same pixels on both sides (identical: 100 dB)
    assert layouts["ulysses 2"]["genbatch"]["psnr_db"] > 40 and layouts["ulysses 2"]["diffusers"]["psnr_db"] > 40
    # diffusers' collectives, counted from outside, send what genbatch's ledger counts: the same all-to-alls and
    # the same output gather
    ulysses = layouts["ulysses 2"]
    assert ulysses["diffusers"]["bytes_per_step_by_kind"]["all_to_all"] > 0
    assert ulysses["ratios"]["bytes_per_step"] == pytest.approx(1.0)
    # ring 2: diffusers' own CPU attention has no log-sum-exp for the ring's merge; its error is printed, and
    # genbatch's side still ran
    ring = layouts["ring 2"]
    assert "return_lse" in ring["diffusers"]["error"] and ring["genbatch"]["seconds_per_step"] > 0
    assert "ring 2: diffusers cannot run it: ValueError" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("layout"))
    assert "ratio" in header and "PSNR" in header
    assert "ulysses 2" in result.stdout and "x |" in result.stdout
    assert "ring 2: diffusers cannot run it" in (out / "versus_parallel.md").read_text()
    assert not list(out.rglob("*.mp4"))  # the media are scored, then removed
