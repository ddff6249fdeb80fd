"""`gen run --batch-size` and the prompt-encode cache end to end, in this process: what the results and timings
record, one encode per distinct prompt, and outputs unchanged by either."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.support.runs import run_cli, write_manifest

ROWS = [{"id": f"same-{index}", "prompt": "a lighthouse on a cliff at dawn", "seed": index, "model": "tiny-flux",
         "width": 32, "height": 32, "num_inference_steps": 2} for index in range(8)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    manifest = write_manifest(str(root / "m.parquet"), ROWS)
    found = {}
    for name, args in {"cached": ("-q",), "uncached": ("--embedding-cache-gib", "0", "-q"),
                       "batched": ("--batch-size", "4", "-q"), "auto": ("--batch-size", "auto")}.items():
        result = run_cli("run", manifest, "--out", str(root / name), *args)
        assert result.returncode == 0, result.stderr
        (root / f"{name}.stderr").write_text(result.stderr)
        found[name] = root / name
    return found


def _encodes(out) -> list[dict]:
    return [row for row in pq.read_table(out / "timings").to_pylist() if row["stage"] == "text_encode"]


def _pixels(out) -> dict[str, np.ndarray]:
    return {path.stem: np.asarray(Image.open(path)).astype(int) for path in sorted((out / "outputs").iterdir())}


def test_one_prompt_is_encoded_once_and_outputs_are_unchanged(runs):
    cached, uncached = _encodes(runs["cached"]), _encodes(runs["uncached"])
    assert len(cached) == len(uncached) == len(ROWS)  # one text_encode row per job, each saying hit or miss
    assert sum(not row["cache_hit"] for row in cached) == 1
    assert sum(not row["cache_hit"] for row in uncached) == len(ROWS)
    for name in _pixels(runs["cached"]):
        assert (runs["cached"] / "outputs" / f"{name}.png").read_bytes() == \
            (runs["uncached"] / "outputs" / f"{name}.png").read_bytes()


def test_batched_results_name_their_batch_and_equal_the_rows_alone(runs):
    results = pq.read_table(runs["batched"] / "results").to_pylist()
    assert {row["batch_size"] for row in results} == {4}
    batches: dict[str, list[str]] = {}
    for row in sorted(results, key=lambda row: row["id"]):
        batches.setdefault(row["batch_id"], []).append(row["id"])
    assert sorted(batches.values()) == [[f"same-{index}" for index in range(4)],
                                         [f"same-{index}" for index in range(4, 8)]]
    alone = pq.read_table(runs["cached"] / "results").to_pylist()
    assert {row["batch_size"] for row in alone} == {1}
    # fp32 rounding of a batched GEMM moves a pixel by at most one level
    ours, theirs = _pixels(runs["batched"]), _pixels(runs["cached"])
    for name, pixels in ours.items():
        assert np.abs(pixels - theirs[name]).max() <= 1, name
    # the denoise steps are the batch's: one row per step for the batch, under its first job's id
    steps = [row for row in pq.read_table(runs["batched"] / "timings").to_pylist() if row["stage"] == "denoise_step"]
    assert len(steps) == 2 * ROWS[0]["num_inference_steps"]
    assert {row["batch_size"] for row in steps} == {4}
    assert {row["job_id"] for row in steps} == {"same-0", "same-4"}


def test_auto_takes_the_largest_batch_that_fits_up_to_16(runs):
    stderr = (runs["auto"].parent / "auto.stderr").read_text()
    assert "--batch-size auto picked 16 (tiny-flux 16;" in stderr  # a tiny model fits 16 rows in any memory
    results = pq.read_table(runs["auto"] / "results").to_pylist()
    assert {row["batch_size"] for row in results} == {len(ROWS)}  # all 8 rows: one batch


def test_a_failure_fails_its_own_batch_and_no_other(tmp_path):
    # guidance 1e38 overflows fp32 (the latents turn inf): those two rows batch together and fail together
    rows = [{"id": f"{kind}-{index}", "prompt": f"a kite over a beach {index}", "seed": index, "model": "tiny-sd3",
             "width": 32, "height": 32, "num_inference_steps": 2, "negative_prompt": "grey",
             "guidance_scale": 1e38 if kind == "bad" else 4.0} for kind in ("good", "bad") for index in range(2)]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--batch-size", "4", "-q")
    assert result.returncode == 1, result.stderr  # some jobs failed
    results = {row["id"]: row for row in pq.read_table(tmp_path / "out" / "results").to_pylist()}
    assert {job: row["status"] for job, row in results.items()} == {
        "good-0": "done", "good-1": "done", "bad-0": "failed", "bad-1": "failed"}
    assert "NaN/inf" in results["bad-0"]["error"] and "bad-0, bad-1" in results["bad-1"]["error"]
    assert results["good-0"]["batch_size"] == 2
