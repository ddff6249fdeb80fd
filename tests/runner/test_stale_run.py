"""`gen run --distrifusion 2` and `gen run --pipefusion 2` end to end on two ranks: the results row and the
done marker name the approximation each job ran under, the timing rows count the method's bytes, and flags that
cannot go together exit 2 before any work, naming the fix."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.support.runs import run_cli, run_cli_on_ranks, write_manifest


@pytest.mark.parametrize(("flags", "label", "kind"), [
    (("--distrifusion", "2", "--warmup-steps", "1"), "distrifusion(patches=2,warmup=1)", "bytes_stale_kv"),
    (("--pipefusion", "2", "--patches", "3"), "pipefusion(patches=3,warmup=1)", "bytes_pp_activation"),
], ids=["distrifusion", "pipefusion"])
def test_the_results_row_and_the_done_marker_name_the_approximation(flags, label, kind, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "fox", "prompt": "a fox in snow", "num_inference_steps": 3}])
    out = tmp_path / "out"
    result = run_cli_on_ranks(2, "run", manifest, "--out", str(out), "--model", "tiny-wan", *flags, "-q")
    assert result.returncode == 0, result.stderr
    (row,) = pq.read_table(out / "results" / "results.parquet").to_pylist()
    assert row["status"] == "done" and row["attention_approximation"] == label
    (marker,) = (out / "done").iterdir()
    assert json.loads(marker.read_text())["record"]["attention_approximation"] == label
    steps = [row for row in pq.read_table(out / "timings").to_pylist() if row["stage"] == "denoise_step"]
    assert len(steps) == 2 * 3 and any(row[kind] for row in steps)  # each rank, each step


def test_flags_that_cannot_go_together_exit_2_naming_the_fix(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "fox", "prompt": "a fox in snow"}])
    out = str(tmp_path / "out")
    warmup = run_cli("run", manifest, "--out", out, "--model", "tiny-wan", "--warmup-steps", "2")
    assert warmup.returncode == 2 and "--warmup-steps 2 applies to --distrifusion" in warmup.stderr
    cache = run_cli("run", manifest, "--out", out, "--model", "tiny-wan", "--distrifusion", "2", "--cache", "fbc:0.1")
    assert cache.returncode == 2 and "use --cache none or --distrifusion 1" in cache.stderr
    patches = run_cli("run", manifest, "--out", out, "--model", "tiny-wan", "--patches", "2")
    assert patches.returncode == 2 and "--patches 2 applies to --pipefusion" in patches.stderr
