"""A batched dp 2 run killed mid-batch (SIGKILL of every process) and run again forms the same batches and
gives the same bytes as an uninterrupted run: the killed batch resumes from its checkpoint, no job runs twice."""

from __future__ import annotations

import os
import time

import pyarrow.parquet as pq
import pytest

from tests.resume.common import outputs
from tests.resume.harness import _kill_all, processes_of
from tests.support.runs import gen, start_gen, write_manifest

pytestmark = pytest.mark.processes  # about processes: fresh ones, never the pool

ROWS = [{"id": f"b-{index}", "prompt": f"a quiet harbour, view {index % 3}", "seed": index, "model": "tiny-flux",
         "width": 64, "height": 64, "num_inference_steps": 16} for index in range(8)]
ARGS = ("--batch-size", "2", "--checkpoint-every", "2", "-q")


def _batches(out) -> dict[str, tuple[str, int]]:
    table = pq.read_table(out / "results").to_pylist()
    return {row["id"]: (row["batch_id"], row["batch_size"]) for row in table}


def test_a_killed_batched_run_resumes_to_the_same_batches_and_bytes(tmp_path):
    import torch

    from tests.resume.common import reference_outputs

    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs
    try:
        reference = reference_outputs(manifest, str(tmp_path / "reference"), *ARGS)
    finally:
        torch.set_num_threads(threads)
    expected = _batches(tmp_path / "reference")
    assert {size for _, size in expected.values()} == {2}

    out = tmp_path / "out"
    process = start_gen("run", manifest, "--out", str(out), "--nproc", "2", *ARGS)
    deadline = time.monotonic() + 120
    checkpoints = out / "checkpoints"
    while time.monotonic() < deadline and process.poll() is None and not (
            checkpoints.exists() and any(name.endswith(".ckpt") for name in os.listdir(checkpoints))):
        time.sleep(0.02)
    assert process.poll() is None, "the run finished before it could be killed; give it more steps"
    time.sleep(0.3)  # into the batch's next steps
    assert _kill_all(process)
    deadline = time.monotonic() + 10
    while processes_of(str(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_of(str(out))

    resumed = gen("run", manifest, "--out", str(out), "--nproc", "2", *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _batches(out) == expected  # the same batches, whichever group ran them and when
    assert outputs_of(out) == reference
    timings = pq.read_table(out / "timings").to_pylist()
    steps = [row for row in timings if row["stage"] == "denoise_step"]
    started_late = {row["job_id"] for row in steps if row["step"] > 0} - {row["job_id"] for row in steps
                                                                         if row["step"] == 0}
    runs = {(row["run_id"], row["job_id"]) for row in steps if row["step"] == 0}
    assert len(runs) == len({job for _, job in runs}), "a batch started from step 0 twice"
    assert started_late or any(row["step"] > 0 for row in steps), "no batch resumed from a checkpoint"


def outputs_of(out) -> dict[str, bytes]:
    from genbatch.io import RunStore

    return outputs(RunStore(str(out)))
