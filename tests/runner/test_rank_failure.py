"""A rank that dies or hangs mid-job makes the others fail within the collective timeout, with an error that
names the rank and the job; the job is recorded failed; nothing hangs; the run exits 75 and a rerun finishes.
Neither prints a Python warning raised from genbatch's own code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from tests.support.own_warnings import genbatch_warnings, probe_env, probed_processes
from tests.support.runs import REPO, gen, start_gen, write_manifest

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

ROWS = [{"id": f"clip-{i}", "prompt": f"a boat on a lake {i}", "model": "tiny-wan", "num_inference_steps": 40,
         "num_frames": 33, "width": 160, "height": 96} for i in range(3)]  # seconds a job even on a fast, idle machine


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(child) for child in handle.read().split()]
    return found + [grandchild for child in found for grandchild in _children(child)]


def _worker(launcher: int, local_rank: int) -> int:
    for pid in _children(launcher):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        except FileNotFoundError:
            continue
        if env.get(b"LOCAL_RANK") == str(local_rank).encode() and b"TORCHELASTIC_RUN_ID" in env:
            return pid
    raise AssertionError(f"no worker with LOCAL_RANK={local_rank} under {launcher}")


def _mid_job(out) -> bool:
    """A job has written a step checkpoint and is not done: both ranks are inside its denoising loop."""
    checkpoints = {path.stem for path in (out / "checkpoints").glob("*.ckpt")}
    done = {path.stem for path in (out / "done").glob("*.json")}
    return bool(checkpoints - done)


@pytest.mark.parametrize("fault", ["dies", pytest.param("dies-then-rerun", marks=pytest.mark.slow),
                                   pytest.param("hangs", marks=pytest.mark.slow)])
def test_a_lost_rank_fails_the_job_naming_rank_and_job(fault, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS)
    out = tmp_path / "out"
    process = start_gen("run", manifest, "--out", str(out), "--nproc", "2", "--ulysses", "2",
                        "--collective-timeout", "15", "-q",  # a loaded machine's skew between ranks stays under it
                        env=probe_env(REPO))  # each warning printed says whose code raised it or called what did
    deadline = time.monotonic() + 180
    while not _mid_job(out) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    assert process.poll() is None, "the run ended before its first job was under way:\n" + process.communicate()[1][-4000:]
    victim = _worker(process.pid, 1)
    started = time.monotonic()
    os.kill(victim, signal.SIGSTOP if fault == "hangs" else signal.SIGKILL)
    while not (out / "failed").exists() and time.monotonic() - started < 60:
        time.sleep(0.1)
    assert (out / "failed").exists(), "the surviving rank did not give up within the timeout"
    if fault == "hangs":
        with contextlib.suppress(ProcessLookupError):  # what a cluster does to a hung process in the end
            os.kill(victim, signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    # `gen run --nproc 2 --ulysses 2`'s start-up and steps print no Python warning of genbatch's own making
    assert probed_processes(stderr) >= 3, stderr[-3000:]  # the launcher and both ranks were probed
    assert not genbatch_warnings(stderr), genbatch_warnings(stderr)
    # the group cannot go on: the run stops as "rerun to continue", like a preemption
    assert process.returncode == 75, stderr
    assert "this group cannot go on" in stderr and "rerun the same command to continue" in stderr
    failed = [json.loads((out / "failed" / name).read_text()) for name in os.listdir(out / "failed")]
    assert len(failed) == 1 and failed[0]["failed_in"] and len(failed[0]["failed_in"]) == 1
    error = json.dumps(failed[0])
    job_id = [row["id"] for row in ROWS if row["id"] in error][0]
    assert f"job {job_id}" in error and "rank 1 stopped responding" in error  # the lost rank, by number
    assert not (out / "done" / f"{job_id}.json").exists()
    if fault == "dies-then-rerun":  # and the rerun does continue: every job done, the failed one included
        rerun = gen("run", manifest, "--out", str(out), "--nproc", "2", "--ulysses", "2", "-q", timeout=300,
                    env=probe_env(REPO))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert not genbatch_warnings(rerun.stderr), genbatch_warnings(rerun.stderr)  # decode and write too
        assert sorted(os.listdir(out / "done")) == sorted(f"{row['id']}.json" for row in ROWS)


def _run_losing_rank_1_after_one_job(rank: int, world_size: int, manifest: str, out: str) -> int:
    """`gen run`'s `run` on a two-rank group whose rank 1 exits right after finishing its first job."""
    from genbatch.runner import run as run_module
    from genbatch.runner.execute import JobExecutor
    from genbatch.runner.options import RunOptions

    finish_batch = JobExecutor.run_batch

    def finish_then_exit(self, jobs):
        result = finish_batch(self, jobs)
        if rank == 1:
            os._exit(9)  # gone between jobs: its peer is at the next hand-out or stop check
        return result

    JobExecutor.run_batch = finish_then_exit
    status = run_module.run(RunOptions.from_flags(manifest, out, {"ulysses": 2, "quiet": True}))
    with open(os.path.join(out, "rank0-status"), "w") as handle:
        handle.write(str(status))
    return status


def test_a_rank_lost_between_jobs_stops_the_run_with_75_and_fails_no_job(tmp_path, capfd):
    from tests.support.distributed import run_on_fresh_ranks

    rows = [{"id": f"still-{i}", "prompt": f"a still lake {i}", "model": "tiny-flux", "num_inference_steps": 2}
            for i in range(3)]
    manifest, out = write_manifest(str(tmp_path / "m.parquet"), rows), tmp_path / "out"
    with pytest.raises(AssertionError, match="process 1 terminated with exit code 9"):
        run_on_fresh_ranks(_run_losing_rank_1_after_one_job, 2, (manifest, str(out)), timeout_s=20,
                           survivors_finish=True)  # rank 0 is not terminated for its peer's exit: it reports
    assert (out / "rank0-status").read_text() == "75"
    assert "rank 0 lost a peer between jobs" in capfd.readouterr().err
    assert len(list((out / "done").glob("*.json"))) == 1
    assert not (out / "failed").exists(), "no job was running when the peer went: none is failed"
