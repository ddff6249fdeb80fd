"""A stop reaches its exit whatever meets it on the way: every place a rank can be stopped, with its stdout and
stderr a pipe whose reader is gone (a launcher, terminal or CI log runner that died), ends the rank with its
status within 10 s. Ranks run under `tests.support.reaper`, which reads their statuses once their launcher
is dead.

- the launcher's death during start-up, the rendezvous, a start-up broadcast, the hand-out, a job (where
  only the grace ends a rank stuck in a collective), the final wait, and `gen run --nproc 2` mid-job;
- signals in the rendezvous (TERM), the hand-out (INT) and the final wait (USR1, then TERM and INT again while
  a cleanup hangs and another raises);
- `end()` from two threads at once.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from genbatch.io import RunStore
from genbatch.jobs import exit_codes
from genbatch.runner.signals import CLEANUP_S, LAUNCHER_PID_ENV
from tests.resume.common import checkpoint_steps
from tests.resume.harness import _alive, _descendants
from tests.runner.stop_driver import PEER_OF
from tests.runner.test_signals import LONG, _listening
from tests.support.distributed import free_port
from tests.support.runs import REPO, write_manifest

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

LIMIT_S = 10.0
"""The most seconds a rank may take to end after its launcher died or it was signalled (issue 24)."""
SPAWNER = (f"import os, subprocess, sys; os.environ[{LAUNCHER_PID_ENV!r}] = str(os.getpid()); "
           "status = subprocess.call(sys.argv[1:], stdout=2, start_new_session=True); "
           "os._exit(status if status >= 0 else 128 - status)")
"""A launcher of one rank, as `gen run --nproc` is for its workers (each in a session of its own): the rank
ends when it dies; while it lives, it exits with its rank's status (128 + N for a death by signal N)."""


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **extra}


class Launched:
    """A launcher under a reaper, its output a pipe closed from the start; the ranks' ends as reported."""

    def __init__(self, command: list[str], env: dict):
        report_read, report_write = os.pipe()
        dead_read, dead_write = os.pipe()
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "tests.support.reaper", str(report_write), *command],
            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=dead_write, stderr=dead_write,
            pass_fds=(report_write,))
        for fd in (report_write, dead_write, dead_read):  # nobody reads the launcher's output: writes fail
            os.close(fd)
        self._report, self._buffer = report_read, b""
        self.launcher = int(self._line(60))

    def _line(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._report], [], [], left)[0]:
                raise AssertionError(f"no report from the reaper within {timeout_s} s")
            chunk = os.read(self._report, 4096)
            if not chunk:
                raise AssertionError(f"the reaper ended early (exit {self.reaper.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def rank_pids(self) -> list[int]:
        return _descendants(self.launcher)

    def kill_launcher(self) -> float:
        """kill -9 of the launcher's process group (the ranks live in sessions of their own, or outlive it)."""
        os.killpg(self.launcher, signal.SIGKILL)
        return time.monotonic()

    def _end(self, since: float) -> tuple[int, int, float]:
        """(pid, status, seconds after `since`) of the next process to end, waiting at most 2 x LIMIT_S."""
        pid, status, at = self._line(2 * LIMIT_S).split()
        return int(pid), int(status), float(at) - since

    def ends(self, since: float, ranks: int = 1) -> list[tuple[int, float]]:
        """(status, seconds after `since`) of each of `ranks` ranks whose launcher was killed."""
        ends = []
        while len(ends) < ranks:
            pid, status, seconds = self._end(since)
            if pid != self.launcher:
                ends.append((status, seconds))
        return ends

    def launcher_end(self, since: float) -> tuple[int, float]:
        """(status, seconds after `since`) of a SPAWNER launcher that was not killed: its rank's."""
        while True:
            pid, status, seconds = self._end(since)
            if pid == self.launcher:
                return status, seconds

    def close(self) -> None:
        for pid in [self.launcher, *_descendants(self.reaper.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reaper.kill()
        self.reaper.wait()
        os.close(self._report)


@pytest.fixture
def launched():
    started = []

    def start(command: list[str], **env: str) -> Launched:
        started.append(Launched(command, _env(**env)))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture
def driver(launched, tmp_path):
    """Start tests/runner/stop_driver.py at PLACE under a launcher (with its silent peer where it has one);
    returns (Launched, the rank's pid) once the rank is there."""
    peers = []

    def start(place: str, *args: str) -> tuple[Launched, int]:
        port = str(free_port())
        world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
        rank = "0" if place == "final-wait" else "1"
        if place != "two-threads":
            peer_ready = str(tmp_path / f"{place}.peer")
            peers.append(subprocess.Popen(
                [sys.executable, "-m", "tests.runner.stop_driver", "peer", peer_ready],
                env=_env(**world, RANK=str(1 - int(rank)), **{PEER_OF: place}), cwd=REPO,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ready = str(tmp_path / place)
        run = launched([sys.executable, "-c", SPAWNER, sys.executable, "-m", "tests.runner.stop_driver", place, ready,
                        *args], **world, RANK=rank)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) or (peers and not os.path.exists(peer_ready)):
            assert time.monotonic() < deadline and (not peers or peers[-1].poll() is None), f"{place}: not ready"
            time.sleep(0.05)
        time.sleep(0.3)  # from the ready file into the wait itself
        with open(ready) as handle:
            return run, int(handle.read())

    yield start
    for peer in peers:
        peer.kill()
        peer.wait()


@pytest.mark.parametrize("place", ["broadcast", "hand-out", "final-wait", "job"])
def test_a_rank_whose_launcher_dies_exits_75_with_stderr_a_closed_pipe(place, driver):
    run, _ = driver(place)
    killed = run.kill_launcher()
    ((status, seconds),) = run.ends(killed)
    assert status == exit_codes.REQUEUE and seconds < LIMIT_S, (status, seconds)


@pytest.mark.parametrize(("place", "signum", "status"), [
    ("hand-out", signal.SIGINT, exit_codes.INTERRUPTED),
    ("final-wait", signal.SIGUSR1, exit_codes.REQUEUE),
], ids=["hand-out-INT", "final-wait-USR1"])
def test_a_signalled_rank_exits_with_its_status_with_stderr_a_closed_pipe(place, signum, status, driver):
    run, pid = driver(place)
    sent = time.monotonic()
    os.kill(pid, signum)
    ended, seconds = run.launcher_end(sent)
    assert ended == status and seconds < LIMIT_S, (ended, seconds)


def test_a_stop_gets_past_a_hanging_and_a_raising_cleanup_and_a_second_signal(driver):
    run, pid = driver("final-wait", "--cleanups", "hang,raise")
    sent = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)  # inside the stop, waiting for the hanging cleanup
    for again in (signal.SIGTERM, signal.SIGINT):
        os.kill(pid, again)
    status, seconds = run.launcher_end(sent)
    assert status == exit_codes.REQUEUE and CLEANUP_S <= seconds < LIMIT_S, (status, seconds)


def test_end_from_two_threads_at_once_exits_once_with_its_status(driver):
    run, _ = driver("two-threads")
    status, seconds = run.launcher_end(time.monotonic())
    assert status == exit_codes.REQUEUE and seconds < LIMIT_S, (status, seconds)


def _gen_run(manifest: str, out: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "genbatch", "run", manifest, "--out", out, "-q", "--model", "tiny-wan", *args]


def _own_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except ProcessLookupError:
        return False


def test_gen_run_whose_launcher_dies_during_start_up_exits_75(launched, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "model": "tiny-wan"}])
    run = launched([sys.executable, "-c", SPAWNER, *_gen_run(manifest, str(tmp_path / "out"))])
    deadline = time.monotonic() + 60
    # the rank in a session of its own: between its fork and its setsid it is still in the launcher's process
    # group, which the kill below is sent to
    while not (ranks := run.rank_pids()) or not all(_own_session(pid) for pid in ranks):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    killed = run.kill_launcher()  # the rank is starting its interpreter or importing: its watcher sees the death
    ((status, seconds),) = run.ends(killed)
    assert status == exit_codes.REQUEUE and seconds < LIMIT_S, (status, seconds)


@pytest.mark.parametrize("how", ["launcher", "TERM"])
def test_gen_run_stopped_in_the_rendezvous_exits_75(how, launched, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox", "model": "tiny-wan"}])
    port = free_port()
    run = launched([sys.executable, "-c", SPAWNER, *_gen_run(manifest, str(tmp_path / "out"))],
                   RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    deadline = time.monotonic() + 120
    while not _listening(port):  # rank 0 serves the store from inside init_process_group, waiting for rank 1
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if how == "launcher":
        since = run.kill_launcher()
    else:
        (pid,) = run.rank_pids()
        since = time.monotonic()
        os.kill(pid, signal.SIGTERM)
    status, seconds = run.ends(since)[0] if how == "launcher" else run.launcher_end(since)
    assert status == exit_codes.REQUEUE and seconds < LIMIT_S, (status, seconds)


@pytest.mark.slow  # test_signals.py's launcher killed mid-job (dp2) holds the checkpoint and the 75 in make test
def test_gen_run_nproc_2_whose_launcher_dies_mid_job_checkpoints_and_exits_75(launched, tmp_path):
    rows = [{"id": f"long-{index}", "prompt": f"a fox in the snow, view {index}", "model": "tiny-wan",
             "num_inference_steps": LONG} for index in range(2)]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    out = str(tmp_path / "out")
    store = RunStore(out)
    run = launched(_gen_run(manifest, out, "--nproc", "2", "--checkpoint-every", "5"))

    def both_inside_a_job() -> bool:
        steps = checkpoint_steps(store) if os.path.isdir(os.path.join(out, "checkpoints")) else {}
        return len(steps) == 2 and all(step <= LONG - 10 for step in steps.values())

    deadline = time.monotonic() + 180
    while not both_inside_a_job():
        assert time.monotonic() < deadline and _alive(run.launcher), "gen run --nproc 2 did not get into its jobs"
        time.sleep(0.05)
    before = checkpoint_steps(store)
    killed = run.kill_launcher()
    ends = run.ends(killed, ranks=2)
    assert [status for status, _ in ends] == [exit_codes.REQUEUE] * 2 and max(s for _, s in ends) < LIMIT_S, ends
    after = checkpoint_steps(store)
    assert set(after) == set(before) and all(after[job] > before[job] for job in before), (before, after)
