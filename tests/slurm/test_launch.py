"""genbatch.slurm.launch: torchrun from the Slurm environment, worker exit statuses kept, signals survived.

These run the launcher for real on this machine (one node, two gloo workers) under a Slurm-like environment;
tests/slurm/test_cluster.py runs it under real srun.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genbatch.jobs.exit_codes import OK, REQUEUE, USAGE
from genbatch.slurm.launch import main as launch_main
from genbatch.slurm.launch import worker_exit_status

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

PROGRAM = str(Path(__file__).parent / "programs" / "allreduce.py")


@pytest.mark.parametrize(
    ("codes", "status"),
    [
        ([0, 0, 0], OK),
        ([REQUEUE], REQUEUE),
        ([REQUEUE, 0], REQUEUE),
        ([1, REQUEUE], REQUEUE),  # any worker asking for a requeue wins: its state is checkpointed
        ([2, 1], 2),  # else the first failure
        ([-9], 128 + 9),  # killed by SIGKILL, as a shell reports it
        ([-15, 1], 128 + 15),
    ],
)
def test_worker_exit_status(codes, status):
    assert worker_exit_status(codes) == status


def test_outside_slurm_or_without_a_command_is_a_usage_error(monkeypatch, capsys):
    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    assert launch_main(["--nproc-per-node", "2", "--", "true"]) == USAGE
    assert "SLURM_JOB_ID is not set" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    assert launch_main(["--nproc-per-node", "2", "--"]) == USAGE


def _start(tmp_path, *program_args):
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    env.update(SLURM_JOB_ID=str(random.randint(1, 999_999)), SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1")
    command = [sys.executable, "-m", "genbatch.slurm.launch", "--nproc-per-node=2", "--",
               sys.executable, PROGRAM, str(tmp_path), *program_args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _records(tmp_path):
    return sorted((json.loads(path.read_text()) for path in tmp_path.glob("*.json")), key=lambda r: r["rank"])


def test_workers_run_and_statuses_come_back(tmp_path):
    (tmp_path / "ok").mkdir(), (tmp_path / "failing").mkdir()
    ok = _start(tmp_path / "ok")
    failing = _start(tmp_path / "failing", "--rank1-exit", "3")
    assert ok.wait(timeout=120) == OK, ok.stdout.read()
    assert failing.wait(timeout=120) == 3, failing.stdout.read()
    records = _records(tmp_path / "ok")
    seen = [(r["rank"], r["world_size"], r["local_rank"], r["sum"]) for r in records]
    assert seen == [(0, 2, 0, 3.0), (1, 2, 1, 3.0)]


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = (task / "children").read_text().split()
            found += [int(child) for child in children]
            frontier += [int(child) for child in children]
    return found


def test_signal_reaches_workers_launcher_survives_and_75_comes_back(tmp_path):
    """Slurm signals every process of a step; the launcher must outlive it and report the workers' 75."""
    launcher = _start(tmp_path, "--wait-signal")
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.ready"))) < 2:
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail(f"workers never got ready:\n{launcher.communicate()[0]}")
        time.sleep(0.1)
    for pid in [launcher.pid, *_descendants(launcher.pid)]:
        os.kill(pid, signal.SIGUSR1)
    assert launcher.wait(timeout=60) == REQUEUE, launcher.stdout.read()
    assert [r["signalled"] for r in _records(tmp_path)] == [True, True]
