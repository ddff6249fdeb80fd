"""`gen submit` + `gen run` on the local Slurm cluster, the issue's end-to-end checks:

(a) a 2-node x 2-process job runs dp 2 x ulysses 2 on gloo; its outputs equal a one-process run's;
(b) a 3-task array completes a manifest, every task its own share, all into one output;
(c) a job on the low partition is preempted by a job on the high one: USR1, checkpoint, exit 75, requeue, and it
    completes with outputs equal to an uninterrupted run's;
(d) `scontrol requeue` in the middle of a run: same result;
(e) `srun` with one task per rank and no torchrun (what users type in their own sbatch scripts): the tasks
    form one run, dp 2 over two nodes, its outputs equal a one-process run's.

The one-process reference runs execute locally (no Slurm) while the cluster works. Outputs are compared byte for
byte, and a CPU's fp32 results depend on its thread count: every process here, reference and Slurm task alike,
runs with THREADS (torchrun would set 1 for several processes a node and leave one process a node all cores).
(a), (b) and (e) run together. (c) and (d) each submit their job when first asked for (make test runs (c) only),
wait until it has written a checkpoint (so it is in the middle of a job) and then preempt (c) or requeue (d);
each must then resume a job from its checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.io import RunStore, decode_mp4

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

SHORT = ("--model", "tiny-wan", "--steps", "4")
"""Options of the short runs (a) and (b)."""
LONG = ("--model", "tiny-wan", "--steps", "60", "--frames", "33", "--width", "160", "--height", "96",
        "--checkpoint-every", "2")
"""Options of the interrupted runs (c) and (d), one job per rank: 540 tokens a step (9x the preset's default
size), so after the first checkpoint (step 2) a job has 58 steps left, several seconds even on an idle machine,
while the signal arrives within about a second."""
THREADS = {"OMP_NUM_THREADS": "1"}
"""Pinned in the reference runs and in the environment the jobs are submitted from (sbatch exports it)."""
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _manifest(path: Path, count: int, word: str) -> Path:
    ids = [f"{word}-{index}" for index in range(count)]
    pq.write_table(pa.table({"id": ids, "prompt": [f"a {word} number {index}" for index in range(count)]}), path)
    return path


@dataclass
class Reference:
    """A one-process `gen run` on this machine, started in the background."""

    out: Path
    process: subprocess.Popen

    def wait(self) -> Path:
        output, _ = self.process.communicate(timeout=600)
        assert self.process.returncode == 0, output
        return self.out


def _reference(root: Path, manifest: Path, options: tuple[str, ...]) -> Reference:
    out = root / f"reference-{manifest.stem}"
    command = [sys.executable, "-m", "genbatch", "run", str(manifest), "--out", str(out), "-q", *options]
    return Reference(out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env={**os.environ, **THREADS}))


def _submit(cluster, root: Path, name: str, manifest: Path, *options: str) -> tuple[int, Path]:
    """`gen submit` for real; returns the job id and the run's output directory."""
    out = root / name
    command = [sys.executable, "-m", "genbatch", "submit", str(manifest), "--out", str(out), "--job-name", name,
               "--log-dir", str(root / "logs"), "--gpus-per-node", "0", "--backend", "gloo", "-q", *options]
    result = subprocess.run(command, env={**cluster.env, **THREADS}, cwd=root, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip()), out


def _log(root: Path, name: str) -> str:
    return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-4000:]
                     for p in sorted((root / "logs").glob(f"{name}-*")) if not p.name.endswith(".sbatch"))


def _completed(cluster, root: Path, name: str, job_id: int, count: int = 1, restarts: str | None = None,
               timeout_s: float = 300) -> list[dict]:
    def done(records):
        return (len(records) == count and all(r["JobState"] in FINAL for r in records)
                and (restarts is None or all(r["Restarts"] == restarts for r in records)))

    try:
        records = cluster.wait_until(job_id, done, timeout_s)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{_log(root, name)}") from None
    assert [(r["JobState"], r["ExitCode"]) for r in records] == [("COMPLETED", "0:0")] * count, _log(root, name)
    return records


def _assert_same_outputs(out: Path, reference: Path, exact: bool = True) -> None:
    """Every job of the reference is done in `out`, with the same video (bytes, or frames within 1/255)."""
    expected = RunStore(str(reference)).done_ids()
    assert expected and RunStore(str(out)).done_ids() == expected
    for job_id in sorted(expected):
        ours, theirs = (Path(base, "outputs", f"{job_id}.mp4").read_bytes() for base in (out, reference))
        if exact:
            assert ours == theirs, f"{job_id}: output differs from the uninterrupted run's"
        else:
            diff = np.abs(decode_mp4(ours).astype(np.int16) - decode_mp4(theirs).astype(np.int16))
            assert diff.max() <= 4 and diff.mean() <= 0.25, f"{job_id}: max {diff.max()}, mean {diff.mean():.3f}"


def _resumed_jobs(out: Path) -> list[str]:
    """Jobs that some run started after step 0: resumed from a checkpoint. (An interrupted run records the
    timings of the jobs it finished only, so the steps before the checkpoint may not appear at all.)"""
    first_step: dict[tuple[str, str], int] = {}
    for row in RunStore(str(out)).read_timings().to_pylist():
        if row["stage"] == "denoise_step":
            key = (row["job_id"], row["run_id"])
            first_step[key] = min(first_step.get(key, row["step"]), row["step"])
    return sorted({job for (job, _), step in first_step.items() if step > 0})


# -- (a) and (b) ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_runs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-genbatch-short")
    manifest = _manifest(root / "short.parquet", 3, "fox")
    reference = _reference(root, manifest, SHORT)
    return root, manifest, reference, {"srun": _submit_srun_tasks(slurm_cluster, root, manifest)}


def _submit_srun_tasks(cluster, root: Path, manifest: Path) -> tuple[int, Path]:
    """A hand-written sbatch script: two nodes, one task each, `srun gen run` with no torchrun."""
    out = root / "srun-tasks"
    script = root / "srun-tasks.sbatch"
    (root / "logs").mkdir(exist_ok=True)  # sbatch's --output folder: Slurm fails a job whose log it cannot open
    script.write_text("\n".join([
        "#!/bin/bash",
        *(f"export {name}={value}" for name, value in THREADS.items()),
        f"srun {sys.executable} -m genbatch run {manifest} --out {out} -q --backend gloo --collective-timeout 120 "
        + " ".join(SHORT),
        "",
    ]))
    job_id = cluster.sbatch("--nodes=2", "--ntasks-per-node=1", "--job-name=srun-tasks", f"--chdir={root}",
                            f"--output={root}/logs/srun-tasks-%j.out", str(script))
    return job_id, out


@pytest.mark.slow  # four ranks on two nodes; test_e and test_cluster's two-node job cover the launch in make test
def test_a_two_nodes_dp2_ulysses2_equal_one_process(slurm_cluster, short_runs):
    root, manifest, reference, _ = short_runs
    job_id, out = _submit(slurm_cluster, root, "dp2-ulysses2", manifest, "--nodes", "2", "--procs-per-node", "2",
                          "--dp", "2", "--ulysses", "2", *SHORT)
    _completed(slurm_cluster, root, "dp2-ulysses2", job_id)
    _assert_same_outputs(out, reference.wait(), exact=False)


@pytest.mark.slow  # genbatch's outputs of a 3-task array; test_cluster.py's array tasks get their shares in make test
def test_b_array_of_three_completes_the_manifest(slurm_cluster, short_runs):
    root, manifest, reference, _ = short_runs
    job_id, out = _submit(slurm_cluster, root, "array3", manifest, "--nodes", "1", "--procs-per-node", "1", "--array",
                          "3", *SHORT)
    _completed(slurm_cluster, root, "array3", job_id, count=3)
    _assert_same_outputs(out, reference.wait())  # one process per task: the same bytes
    runs_per_job = {}
    for row in RunStore(str(out)).read_timings().to_pylist():
        runs_per_job.setdefault(row["job_id"], set()).add(row["run_id"])
    assert all(len(runs) == 1 for runs in runs_per_job.values()), runs_per_job  # each job generated once
    assert len(set().union(*runs_per_job.values())) == 3  # by three different tasks: one share each


def test_e_srun_tasks_without_torchrun_form_one_run(slurm_cluster, short_runs):
    root, _, reference, jobs = short_runs
    job_id, out = jobs["srun"]
    _completed(slurm_cluster, root, "srun-tasks", job_id)
    _assert_same_outputs(out, reference.wait())  # dp only: each job in one process, the same bytes
    info = json.loads((out / "run.json").read_text())
    assert info["world_size"] == 2 and info["layout"] == "dp2", info
    timings = RunStore(str(out)).read_timings().to_pylist()
    assert {row["rank"] for row in timings} == {0, 1}  # both tasks worked, as ranks of one run
    encodes = [row["job_id"] for row in timings if row["stage"] == "compress"]
    assert sorted(encodes) == sorted(set(encodes)) and len(encodes) == 3  # every job generated once


# -- (c) and (d) ----------------------------------------------------------------------------------------------


def _wait_for_checkpoint(cluster, root: Path, name: str, out: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not list((out / "checkpoints").glob("*.ckpt")):
        assert time.monotonic() < deadline, f"no checkpoint in {out} after {timeout_s} s\n{_log(root, name)}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def long_inputs(slurm_cluster, tmp_path_factory):
    """(root, manifest, reference) of the jobs that are stopped mid-run: long enough to be caught mid-job."""
    root = tmp_path_factory.mktemp("slurm-genbatch-interrupted")
    manifest = _manifest(root / "long.parquet", 2, "owl")
    return root, manifest, _reference(root, manifest, LONG)


ON_ONE_NODE = ("--nodes", "1", "--procs-per-node", "2", "--partition", "low", "--extra-sbatch=--exclusive")


@pytest.fixture(scope="module")
def preempted_run(slurm_cluster, long_inputs):
    """A job on n1 preempted mid-run by an urgent one on the high partition."""
    root, manifest, reference = long_inputs
    preempted = _submit(slurm_cluster, root, "preempted", manifest, *ON_ONE_NODE, "--extra-sbatch=--nodelist=n1",
                        *LONG)
    _wait_for_checkpoint(slurm_cluster, root, "preempted", preempted[1])
    urgent = slurm_cluster.sbatch("--partition=high", "--nodelist=n1", "--exclusive", "--job-name=urgent",
                                  f"--output={root}/logs/urgent-%j.out", f"--chdir={root}", "--wrap=sleep 1")
    return root, reference, {"preempted": preempted, "urgent": urgent}


@pytest.fixture(scope="module")
def requeued_run(slurm_cluster, long_inputs):
    """A job on n2 requeued mid-run by `scontrol requeue` (made only where a test asks for it: make test-slow)."""
    root, manifest, reference = long_inputs
    requeued = _submit(slurm_cluster, root, "requeued", manifest, *ON_ONE_NODE, "--extra-sbatch=--nodelist=n2", *LONG)
    _wait_for_checkpoint(slurm_cluster, root, "requeued", requeued[1])
    slurm_cluster.run("scontrol", "requeue", str(requeued[0]))
    return root, reference, {"requeued": requeued}


def test_c_preempted_job_checkpoints_requeues_and_completes(slurm_cluster, preempted_run):
    root, reference, jobs = preempted_run
    job_id, out = jobs["preempted"]
    _completed(slurm_cluster, root, "preempted", job_id, restarts="1")
    _completed(slurm_cluster, root, "urgent", jobs["urgent"])
    log = _log(root, "preempted")
    assert "SIGUSR1" in log and "workers exited with status 75" in log and "requeueing job" in log, log
    _assert_same_outputs(out, reference.wait())
    assert _resumed_jobs(out), "no job resumed from a checkpoint: the preemption came between jobs"
    assert not list((out / "checkpoints").glob("*.ckpt"))  # finished jobs leave no checkpoint


@pytest.mark.slow  # a further requeue on the running cluster
def test_d_scontrol_requeue_mid_run_gives_the_same_outputs(slurm_cluster, requeued_run):
    root, reference, jobs = requeued_run
    job_id, out = jobs["requeued"]
    _completed(slurm_cluster, root, "requeued", job_id, restarts="1")
    assert "(restart 1) starts" in _log(root, "requeued")
    _assert_same_outputs(out, reference.wait())
    assert _resumed_jobs(out), "no job resumed from a checkpoint after the requeue"
    assert not list((out / "checkpoints").glob("*.ckpt"))
