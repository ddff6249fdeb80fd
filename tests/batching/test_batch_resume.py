"""A batched dp 2 run killed mid-batch (SIGKILL of every process) and run again forms the same batches and
gives the same bytes as an uninterrupted run: the killed batch resumes from its checkpoint, no job runs twice."""

from __future__ import annotations

import json
import os
import time

import pyarrow.parquet as pq
import pytest

from tests.resume.common import outputs
from tests.resume.harness import _kill_all, processes_of
from tests.support.runs import gen, start_gen, write_manifest

pytestmark = pytest.mark.processes  # about processes: fresh ones, never the pool

ROWS = [{"id": f"b-{index}", "prompt": f"a quiet harbour, view {index % 3}", "seed": index, "model": "tiny-flux",
         "width": 64, "height": 64, "num_inference_steps": 24} for index in range(8)]
ARGS = ("--batch-size", "2", "--checkpoint-every", "2", "-q")


def _batches(out) -> dict[str, tuple[str, int]]:
    table = pq.read_table(out / "results").to_pylist()
    return {row["id"]: (row["batch_id"], row["batch_size"]) for row in table}


@pytest.mark.slow  # a kill mid-batch and its resume: tests/runner/test_kill_resume.py kills and resumes in make test
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

    def saved() -> set[str]:
        return {name[:-5] for name in os.listdir(checkpoints) if name.endswith(".ckpt")} if checkpoints.exists() \
            else set()

    while time.monotonic() < deadline and process.poll() is None and not saved():
        time.sleep(0.01)
    # at once: a batch just checkpointed at a step boundary and has most of its 24 steps to go
    assert _kill_all(process), "the run finished before it could be killed; give it more steps"
    done_before = {name[:-5] for name in os.listdir(out / "done")} if (out / "done").exists() else set()
    resumable = saved() - done_before
    deadline = time.monotonic() + 10
    while processes_of(str(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_of(str(out))
    assert resumable, "no unfinished batch had a checkpoint at the kill"

    resumed = gen("run", manifest, "--out", str(out), "--nproc", "2", *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _batches(out) == expected  # the same batches, whichever group ran them and when
    assert outputs_of(out) == reference
    steps = [row for row in pq.read_table(out / "timings").to_pylist() if row["stage"] == "denoise_step"]
    rerun_id = json.loads((out / "run.json").read_text())["run_id"]  # the last run's
    rerun = [row for row in steps if row["run_id"] == rerun_id]
    first_step = {}
    for row in rerun:
        first_step[row["job_id"]] = min(first_step.get(row["job_id"], row["step"]), row["step"])
    # a batch checkpointed at the kill resumed from its checkpoint, not from step 0 (its steps are under its first
    # job's id, the name of its checkpoint)
    assert all(first_step[job] > 0 for job in resumable if job in first_step), (resumable, first_step)
    assert any(job in first_step for job in resumable), (resumable, first_step)
    # and no batch done before the kill ran again
    assert not done_before & set(first_step), (done_before, first_step)


def outputs_of(out) -> dict[str, bytes]:
    from genbatch.io import RunStore

    return outputs(RunStore(str(out)))
