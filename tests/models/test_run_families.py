"""`gen run` with the Qwen-Image and HunyuanVideo presets: a two-row manifest each, every row's media written,
every step timed. Qwen-Image's rows run with and without a negative prompt (two branches and one)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from genbatch.io import decode_mp4, decode_png
from tests.support.runs import run_cli, write_manifest

RUNS = {
    "tiny-qwen-image": ([{"id": "lake", "prompt": "a lake at dawn", "negative_prompt": "blurry"},
                         {"id": "tower", "prompt": "a clock tower in fog"}], "png", (64, 64, 3)),
    "tiny-hunyuan-video": ([{"id": "wave", "prompt": "a wave breaking on rocks"},
                            {"id": "kite", "prompt": "a red kite over a hill", "guidance_scale": 3.0}],
                           "mp4", (9, 48, 64, 3)),
}


@pytest.mark.parametrize("preset", sorted(RUNS))
def test_gen_run_writes_every_row(preset, tmp_path):
    rows, ext, shape = RUNS[preset]
    manifest = write_manifest(str(tmp_path / "m.parquet"),
                              [{**row, "model": preset, "num_inference_steps": 2} for row in rows])
    out = tmp_path / "out"
    result = run_cli("run", manifest, "--out", str(out), "-q")
    assert result.returncode == 0, result.stderr
    decode = decode_png if ext == "png" else decode_mp4
    media = [decode((out / "outputs" / f"{row['id']}.{ext}").read_bytes()) for row in rows]
    assert [m.shape for m in media] == [shape, shape]  # the preset's default sizes (and frames)
    assert not np.array_equal(media[0], media[1])
    results = {row["id"]: row for row in pq.read_table(out / "results" / "results.parquet").to_pylist()}
    assert {results[row["id"]]["status"] for row in rows} == {"done"}
    steps = {(row["job_id"], row["step"]) for row in pq.read_table(out / "timings").to_pylist()
             if row["stage"] == "denoise_step"}
    assert steps == {(row["id"], step) for row in rows for step in (0, 1)}
