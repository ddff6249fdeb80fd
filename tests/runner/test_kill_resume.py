"""kill -9 in the middle of a run, run again: every job done exactly once, outputs equal an uninterrupted run."""

from __future__ import annotations

import os
import signal
import time

import pyarrow.parquet as pq
import pytest

from genbatch.io import decode_mp4
from tests.resume.harness import uninterrupted_outputs
from tests.support.runs import gen, start_gen, write_manifest

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

ROWS = [
    {"id": f"job-{index}", "prompt": f"scene number {index}", "num_inference_steps": 12, "width": 96,
     **({"model": "tiny-wan", "num_frames": 17} if index % 2 else {"model": "tiny-flux", "height": 96})}
    for index in range(6)
]  # about a second a job on a fast, idle machine: the kill lands mid-run


def _done(out) -> set[str]:
    folder = out / "done"
    return {name[:-5] for name in os.listdir(folder)} if folder.exists() else set()


def _outputs(out) -> dict[str, object]:
    found = {}
    for name in sorted(os.listdir(out / "outputs")):
        data = (out / "outputs" / name).read_bytes()
        found[name] = decode_mp4(data).tobytes() if name.endswith(".mp4") else data
    return found


def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS)
    reference = tmp_path / "reference"
    uninterrupted_outputs(manifest, str(reference))  # in this process, with one thread as `gen` has below

    out = tmp_path / "out"
    process = start_gen("run", manifest, "--out", str(out), "-q")
    deadline = time.monotonic() + 120
    while len(_done(out)) < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed; give it more work"
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before = _done(out)
    assert 2 <= len(done_before) < len(ROWS)

    resumed = gen("run", manifest, "--out", str(out), "-q")
    assert resumed.returncode == 0, resumed.stderr
    assert _done(out) == {row["id"] for row in ROWS}
    assert _outputs(out) == _outputs(reference)  # same files, same pixels

    # Nothing done before the kill was generated again: the second attempt's media encodes are the rest.
    timings = pq.read_table(out / "timings").to_pylist()
    attempts = sorted({row["run_id"] for row in timings})
    encoded_later = {row["job_id"] for row in timings if row["stage"] == "compress" and row["run_id"] == attempts[-1]}
    assert encoded_later == {row["id"] for row in ROWS} - done_before, (attempts, sorted(done_before), [(r["run_id"], r["job_id"], r["stage"]) for r in timings if r["stage"] == "compress"])
    assert not [name for name in os.listdir(out / "outputs") if name.startswith(".") or ".tmp" in name]
