"""Signals outside a job and a launcher's death end a rank within seconds, with the documented status:

- SIGTERM / SIGUSR1 to a rank held in the rendezvous (a world of 2 started with one process; the collective
  timeout is 600 s) end it with 75, SIGINT with 130;
- `kill -9` of the process group of `gen run --nproc 2` (its ranks run in sessions of their own) ends the
  ranks within 10 s: during start-up, and mid-job, where each rank checkpoints its job first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from genbatch.io import RunStore
from genbatch.jobs import exit_codes
from tests.resume.common import checkpoint_steps, steps_by_attempt, wait_until
from tests.resume.harness import _alive, _descendants
from tests.support.distributed import free_port
from tests.support.runs import REPO, start_gen, write_manifest

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

LIMIT_S = 10.0
"""The most seconds a rank may take to end (issue 12)."""
LONG = 1000
"""Steps in a long job: far more than a rank runs between the test's last look and its kill, even under load."""


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize(("signum", "status"), [
    (signal.SIGTERM, exit_codes.REQUEUE),
    pytest.param(signal.SIGUSR1, exit_codes.REQUEUE, marks=pytest.mark.slow),  # TERM's path (Slurm: tests/slurm)
    (signal.SIGINT, exit_codes.INTERRUPTED),
], ids=["TERM", "USR1", "INT"])
def test_a_signal_during_the_rendezvous_ends_the_rank_at_once(signum, status, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "model": "tiny-wan"}])
    port = free_port()
    rank0 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    process = start_gen("run", manifest, "--out", str(tmp_path / "out"), "-q", "--model", "tiny-wan", env=rank0)
    # rank 0 serves the rendezvous store from inside init_process_group, where it waits for rank 1 for good
    wait_until(lambda: _listening(port), process, what="rank 0 of a world of 2")
    sent = time.monotonic()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < LIMIT_S, stderr
    assert process.returncode == status, stderr
    assert f"{signal.Signals(signum).name} received during the rendezvous" in stderr
    assert "rerun the same command to continue" in stderr  # SIGINT's too: the state is kept, a rerun resumes


def _start_launcher(manifest: str, out: str, *args: str) -> subprocess.Popen:
    """`gen run --nproc 2` as the leader of a process group of its own (so the test can kill the group)."""
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "genbatch", "run", manifest, "--out", out, "-q", "--model", "tiny-wan",
         "--nproc", "2", "--checkpoint-every", "5", *args],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _kill_group_and_wait(launcher: subprocess.Popen, ranks: list[int]) -> float:
    """kill -9 the launcher's process group; seconds until every rank is gone (or LIMIT_S exceeded)."""
    os.killpg(launcher.pid, signal.SIGKILL)
    killed = time.monotonic()
    launcher.wait()
    while any(_alive(pid) for pid in ranks) and time.monotonic() - killed < 2 * LIMIT_S:
        time.sleep(0.05)
    for pid in ranks:  # do not leave them to the rest of the suite if the test fails
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return time.monotonic() - killed


def test_ranks_end_when_their_launcher_is_killed_during_start_up(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "model": "tiny-wan"}])
    launcher = _start_launcher(manifest, str(tmp_path / "out"))
    wait_until(lambda: len(_descendants(launcher.pid)) >= 2, launcher, what="gen run --nproc 2")
    ranks = _descendants(launcher.pid)  # started, not yet past start-up (the kill may even beat their watch)
    assert _kill_group_and_wait(launcher, ranks) < LIMIT_S, launcher.stderr.read()[-3000:]


@pytest.mark.parametrize(("args", "groups"), [
    ((), 2),
    pytest.param(("--ulysses", "2"), 1, marks=pytest.mark.slow),  # one group of two: they agree on the stop
], ids=["dp2", "ulysses2"])
def test_ranks_checkpoint_and_end_when_their_launcher_is_killed_mid_job(args, groups, tmp_path):
    rows = [{"id": f"long-{index}", "prompt": f"a fox in the snow, view {index}", "model": "tiny-wan",
             "num_inference_steps": LONG} for index in range(4)]  # two jobs a group: the groups overlap in one
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    out = str(tmp_path / "out")
    store = RunStore(out)
    launcher = _start_launcher(manifest, out, *args)

    def every_group_inside_a_job() -> bool:  # a periodic checkpoint each, with steps left to stop in
        steps = checkpoint_steps(store) if os.path.isdir(os.path.join(out, "checkpoints")) else {}
        return len(steps) == groups and all(step <= LONG - 10 for step in steps.values())

    wait_until(every_group_inside_a_job, launcher, what="gen run --nproc 2")
    ranks = _descendants(launcher.pid)
    before = checkpoint_steps(store)
    assert _kill_group_and_wait(launcher, ranks) < LIMIT_S, launcher.stderr.read()[-3000:]
    after = checkpoint_steps(store)
    # each rank stopped at a step boundary after the kill and checkpointed there: later than any step before
    assert set(after) == set(before) and all(after[job] > before[job] for job in before), (before, after)
    assert not store.done_ids() & set(after)
    for job_id, step in after.items():  # every rank of the group timed the same steps, up to the checkpoint
        (ranks,) = steps_by_attempt(store)[job_id].values()
        assert len(ranks) == 2 // groups and all(steps == list(range(step)) for steps in ranks.values()), ranks


def test_sigint_inside_a_job_exits_130(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "long", "prompt": "a fox in the snow", "model": "tiny-wan", "num_inference_steps": LONG}])
    out = str(tmp_path / "out")
    store = RunStore(out)
    process = start_gen("run", manifest, "--out", out, "-q", "--model", "tiny-wan", "--checkpoint-every", "2")
    wait_until(lambda: os.path.isdir(os.path.join(out, "checkpoints")) and bool(checkpoint_steps(store)), process,
               what="a one-process run")  # inside the job: it checkpointed
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == exit_codes.INTERRUPTED, stderr
    assert "interrupted (SIGINT)" in stderr and not store.done_ids()
    assert "rerun the same command to continue from the last checkpoint" in stderr
