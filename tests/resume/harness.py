"""The crash harness: `gen run --nproc 2` (two dp groups) on the tiny presets, killed at random moments, rerun
after each kill until the manifest is complete, and checked after every attempt and at the end. A kill is
one of KILLS:

    all      SIGKILL of every process of the run at once, as when a node is lost
    group    SIGKILL of the launcher's process group, as a terminal or CI runner ends a job: the ranks (in
             sessions of their own) outlive it and must end themselves
    usr1     SIGUSR1 to the launcher, as Slurm's --signal sends it: it stops its ranks, which checkpoint

and an attempt's stdout and stderr are either a log file or (with `pipe_share`) a pipe the harness drains
and closes at the kill, as a dying terminal or log runner does: every write of the run after it fails.

    after each kill      within ORPHAN_BOUND_S no process of the attempt is left (found by the run's --out on
                         their command lines); one still there is an orphan, a violation, and is killed
    after each attempt   every done marker names a whole output equal to the uninterrupted run's; markers
                         already there are unchanged; new markers belong to the new attempt; no job failed
    at the end           every job done exactly once (the last attempt redid nothing done before it), every
                         output equal to the uninterrupted run's, one results row per job; no checkpoints,
                         temp files, stray objects, orphaned markers or open multipart uploads

A kill lands during start-up (sometimes), or once rank 0 has started the attempt, or after a random number
of the attempt's jobs are done, plus a random fraction of a job (mid-denoise, mid-decode, mid-upload, between
a commit and its checkpoint's deletion). Checkpoints every 2 steps, so killed jobs usually resume from one.

    report = crash_trials(new_target, trials=20, reference=..., rng=random.Random(0), kills=KILLS, pipe_share=0.5)

Used by tests/resume/test_crash.py (a few trials) and bench/crash.py (the full count).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from genbatch.io import RunStore
from tests.resume.common import encoded_by_attempt, leftovers, outputs, reference_outputs, steps_by_attempt
from tests.support.runs import REPO, write_manifest

ROWS = [
    {"id": f"crash-{index}", "prompt": f"a street market at night, view {index}",
     "model": "tiny-wan" if index % 3 else "tiny-flux", "num_inference_steps": steps}
    for index, steps in enumerate([24, 6, 16, 8, 30, 4, 12, 10])
]
IDS = {row["id"] for row in ROWS}
CHECKPOINT_EVERY = 2
KILLS = ("all", "group", "usr1")
"""The ways an attempt is ended (see the top)."""
ORPHAN_BOUND_S = 10.0
"""Seconds after a kill by which no process of the attempt may be left."""


def write_crash_manifest(path: str) -> str:
    return write_manifest(path, ROWS)


def uninterrupted_outputs(manifest: str, out: str) -> dict:
    """The manifest run whole, in this process with one thread like each worker: outputs by name (each job
    runs on one rank under dp, so the layout does not change them)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reference_outputs(manifest, out)
    finally:
        torch.set_num_threads(threads)


@dataclass(kw_only=True, slots=True)
class Target:
    """Where one trial's run goes."""

    url: str
    """--out of the run (a fresh local folder or S3 prefix per trial)."""
    storage_options: dict = field(default_factory=dict)
    """Options for reading the run back here."""
    env: dict = field(default_factory=dict)
    """Environment of `gen run` (S3 endpoint and credentials)."""
    open_uploads: Callable[[], list] = list
    """Open multipart uploads under the run (S3), else always []."""


@dataclass(kw_only=True, slots=True)
class CrashReport:
    trials: int = 0
    kills: int = 0
    attempts: int = 0
    """gen run starts, killed ones included."""
    resumed_from_checkpoint: int = 0
    """Jobs continued from a step checkpoint (not step 0) by an attempt that lived to write its timings."""
    kills_by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILLS, 0))
    closed_pipes: int = 0
    """Kills of attempts whose stdout and stderr were pipes, closed at the kill."""
    orphans: int = 0
    """Processes of a killed attempt still alive ORPHAN_BOUND_S after the kill (each also a violation)."""
    violations: list[str] = field(default_factory=list)

    def line(self, label: str) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in self.kills_by_kind.items() if count)
        return (f"{label}: trials {self.trials}, kills {self.kills} ({kinds}; {self.closed_pipes} with closed "
                f"pipes), attempts {self.attempts}, jobs resumed from a checkpoint {self.resumed_from_checkpoint}, "
                f"orphans {self.orphans}, violations {len(self.violations)}")


def _descendants(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
    except FileNotFoundError:
        return []
    return found + [grandchild for child in found for grandchild in _descendants(child)]


def _kill_all(process: subprocess.Popen) -> bool:
    """SIGKILL the launcher and every worker at once (workers run in sessions of their own); True if the
    run was still going."""
    pids = [process.pid] + _descendants(process.pid)
    if process.poll() is not None:
        return False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def processes_of(marker: str) -> list[int]:
    """Live processes with `marker` as one of their command-line arguments (a run's --out)."""
    found, wanted = [], marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if wanted in argv and _alive(int(name)):
            found.append(int(name))
    return found


class _Output:
    """An attempt's stdout and stderr: a log file, or a pipe drained into it until `close` (then the run's
    writes fail, as when the terminal or log runner reading them has gone)."""

    def __init__(self, log: str, pipe: bool):
        self.log, self.pipe = log, pipe
        self._handle = open(log, "wb")
        self._read = self._write = None
        self._stopped = threading.Event()
        self._drain = None
        if pipe:
            self._read, self._write = os.pipe()
            self._drain = threading.Thread(target=self._copy, daemon=True)

    @property
    def fd(self) -> int:
        return self._write if self.pipe else self._handle.fileno()

    def started(self) -> None:
        """The run has its copy of the write end."""
        if self.pipe:
            os.close(self._write)
            self._drain.start()

    def _copy(self) -> None:
        import select

        while not self._stopped.is_set():
            if select.select([self._read], [], [], 0.1)[0]:
                chunk = os.read(self._read, 65536)
                if not chunk:
                    return
                self._handle.write(chunk)

    def close(self, at_once: bool) -> None:
        """Stop reading (`at_once`: now, else once the run has closed its end) and close everything (once)."""
        if self._handle.closed:
            return
        if self.pipe:
            if at_once:
                self._stopped.set()
            self._drain.join()
            os.close(self._read)
        self._handle.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _markers(store: RunStore) -> dict[str, bytes]:
    folder = store.layout.join("done")
    return {name: store.objects.read(f"{folder}/{name}") for name in store.objects.list_names(folder)}


def _attempts(store: RunStore) -> set[str]:
    return {name.removesuffix(".json") for name in store.objects.list_names(store.layout.join("attempts"))}


class _Trial:
    """One trial: attempts until `gen run` exits 0 (kills first); violations go to the report."""

    def __init__(self, target: Target, manifest: str, reference: dict, report: CrashReport, rng: random.Random,
                 nproc: int, logs: str, kills: tuple[str, ...], pipe_share: float):
        self.target, self.manifest, self.reference = target, manifest, reference
        self.report, self.rng, self.nproc, self.logs = report, rng, nproc, logs
        self.kills, self.pipe_share = kills, pipe_share
        self.reported_failures: set[str] = set()
        self.store = RunStore(target.url, target.storage_options)

    def violation(self, text: str) -> None:
        self.report.violations.append(f"trial {self.report.trials}: {text}")

    def start(self) -> tuple[subprocess.Popen, _Output]:
        log = os.path.join(self.logs, f"trial{self.report.trials}-attempt{self.report.attempts}.log")
        output = _Output(log, pipe=self.rng.random() < self.pipe_share)
        env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **self.target.env}
        command = [sys.executable, "-m", "genbatch", "run", self.manifest, "--out", self.target.url, "-q",
                   "--nproc", str(self.nproc), "--checkpoint-every", str(CHECKPOINT_EVERY)]
        process = subprocess.Popen(command, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=output.fd,
                                   stderr=output.fd, start_new_session=True)  # the leader of a process group
        output.started()
        self.report.attempts += 1
        return process, output

    def end(self, process: subprocess.Popen, output: _Output) -> bool:
        """End the attempt by one of the trial's kills, closing its pipes at that moment; then wait at most
        ORPHAN_BOUND_S for every process of it to be gone. True if the run was still going."""
        if process.poll() is not None:
            output.close(at_once=False)
            return False
        kind = self.rng.choice(self.kills)
        if kind == "all":
            _kill_all(process)
        elif kind == "group":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGUSR1)
        killed = time.monotonic()
        output.close(at_once=True)
        self.report.kills_by_kind[kind] += 1
        self.report.closed_pipes += output.pipe
        try:
            process.wait(timeout=ORPHAN_BOUND_S)
        except subprocess.TimeoutExpired:
            self.violation(f"the launcher did not end within {ORPHAN_BOUND_S:g} s of {kind}")
        while processes_of(self.target.url) and time.monotonic() - killed < ORPHAN_BOUND_S:
            time.sleep(0.05)
        left = processes_of(self.target.url)
        if left:
            self.report.orphans += len(left)
            self.violation(f"{len(left)} process(es) of the attempt still alive {ORPHAN_BOUND_S:g} s after {kind} "
                           f"({'closed pipes' if output.pipe else 'a log file'}): {left}")
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        return True

    def kill_at_random(self, process: subprocess.Popen, output: _Output, done_before: int, first: bool) -> bool:
        """Kill at a random moment; the first kill of a trial comes before half the jobs are done (so it
        lands), later ones anywhere (they may come too late: the attempt then simply completes)."""
        if not first and self.rng.random() < 0.15:  # during start-up: launcher, rendezvous, recover(), model loading
            time.sleep(self.rng.uniform(0.0, 4.0))
            return self.end(process, output)
        pending = len(IDS) - done_before
        wanted = self.rng.randrange(max(1, pending // 2 if first else pending))
        if wanted == 0:  # once rank 0 has written this attempt's run info: loading, the first jobs
            attempts = len(_attempts(self.store))
            self._wait(process, lambda: len(_attempts(self.store)) > attempts)
            time.sleep(self.rng.uniform(0.0, 1.5))
        else:  # a random share of a job after the attempt's `wanted`-th job is done
            self._wait(process, lambda: len(self.store.done_ids()) >= done_before + wanted)
            time.sleep(self.rng.uniform(0.0, 0.6))
        return self.end(process, output)

    @staticmethod
    def _wait(process: subprocess.Popen, condition: Callable[[], bool]) -> None:
        while process.poll() is None and not condition():
            time.sleep(0.05)

    def check_attempt(self, markers_before: dict[str, bytes], attempts_before: set[str]) -> None:
        markers = _markers(self.store)
        for name, body in markers_before.items():
            if markers.get(name) != body:
                self.violation(f"done marker {name} changed or vanished")
        new_attempts = _attempts(self.store) - attempts_before
        for name in set(markers) - set(markers_before):
            job_id = name.removesuffix(".json")
            record = self.store.read_done(job_id)
            if record["run_id"] in attempts_before or not new_attempts:
                self.violation(f"{job_id} got a done marker from an earlier attempt {record['run_id']}")
        found = outputs(self.store)
        for job_id in self.store.done_ids():
            name = os.path.basename(self.store.read_done(job_id)["output_uri"])
            if found.get(name) != self.reference[name]:
                self.violation(f"{job_id} is done but its output differs from the uninterrupted run's")
        for job_id in sorted(self.store.failed_ids() - self.reported_failures):
            self.reported_failures.add(job_id)
            record = self.store.objects.read(self.store.layout.failed(job_id)).decode(errors="replace")
            self.violation(f"job {job_id} failed: {record[:1500]}")

    def check_final(self, done_before_last: set[str], attempts_before: set[str]) -> None:
        done = self.store.done_ids()
        if done != IDS:
            self.violation(f"not done after exit 0: {sorted(IDS - done)}")
        if outputs(self.store) != self.reference:
            self.violation("outputs differ from the uninterrupted run's")
        for item in leftovers(self.store, IDS) + self.target.open_uploads():
            self.violation(f"left behind: {item}")
        results = self.store.read_results().to_pylist()
        if sorted(row["id"] for row in results) != sorted(IDS) or {row["status"] for row in results} != {"done"}:
            self.violation("results table is not one done row per job")
        (last,) = _attempts(self.store) - attempts_before  # the attempt that exited 0
        generated, pending = encoded_by_attempt(self.store).get(last, set()), IDS - done_before_last
        if generated != pending:
            self.violation(f"last attempt generated {sorted(generated)}, pending were {sorted(pending)}")
        for attempts in steps_by_attempt(self.store).values():  # killed attempts leave no timings
            if any(min(min(steps) for steps in ranks.values()) > 0 for ranks in attempts.values()):
                self.report.resumed_from_checkpoint += 1

    def run(self, count: int) -> None:
        """Attempts until one exits 0, the first `count` of them killed."""
        first = True
        while True:
            markers_before, attempts_before = _markers(self.store), _attempts(self.store)
            done_before = self.store.done_ids()
            process, output = self.start()
            killed = count > 0 and self.kill_at_random(process, output, len(done_before), first)
            first = False
            if killed:
                count -= 1
                self.report.kills += 1
            else:
                process.wait()
                output.close(at_once=False)
            self.check_attempt(markers_before, attempts_before)
            if not killed:
                if process.returncode != 0:
                    with open(output.log) as handle:
                        self.violation(f"exit {process.returncode}: {handle.read()[-2000:]}")
                    return
                self.check_final(done_before, attempts_before)
                return


def crash_trials(new_target: Callable[[int], Target], *, manifest: str, reference: dict, trials: int,
                 rng: random.Random, max_kills: int = 3, nproc: int = 2, kills: tuple[str, ...] = ("all",),
                 pipe_share: float = 0.0, log: Callable[[str], None] = lambda text: None) -> CrashReport:
    """Run `trials` trials, each on a fresh target with 1..max_kills kills, each of a kind drawn from `kills`
    (KILLS), of attempts whose output is a pipe closed at the kill in `pipe_share` of them; return the counts."""
    unknown = set(kills) - set(KILLS)
    if unknown or not kills:
        raise ValueError(f"kills {kills}: choose from {KILLS}")
    report = CrashReport()
    with tempfile.TemporaryDirectory() as logs:
        for index in range(trials):
            count = rng.randint(1, max_kills)
            report.trials += 1
            before = (report.kills, len(report.violations))
            _Trial(new_target(index), manifest, reference, report, rng, nproc, logs, kills, pipe_share).run(count)
            log(f"trial {index + 1}/{trials}: {report.kills - before[0]} kills, "
                f"{len(report.violations) - before[1]} violations")
    return report
