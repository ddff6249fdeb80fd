"""Preemption: SIGUSR1 / SIGTERM ask the run to stop; where the rank is decides how soon.

    stop = StopRequest().install()     # SIGUSR1/SIGTERM only set a flag (the denoise loop reads it)
    stop.watch()                       # `gen run` only: waits end on a signal, ranks end with their launcher
    with stop.waiting("the rendezvous"):
        dist.init_process_group(...)   # SIGTERM/SIGUSR1 here: exit 75 at once; SIGINT: exit 130

Inside a job the handler only sets a flag: the ranks of the job group agree on it at a step boundary
(`runner/agreement.py`), the group checkpoints, and the process exits with `exit_codes.REQUEUE`. Slurm
sends USR1 before a time limit or preemption (`--signal=B:USR1@grace`) and torchrun forwards SIGTERM to
its workers. `gen run` installs the handler before its heavy imports, so a signal that arrives while it
starts up is kept too. (This module imports nothing heavy for that reason.)

Outside a job, in a `waiting` region (the rendezvous, the manifest broadcast, the hand-out, the final
wait), a rank has nothing to checkpoint but may sit in a C++ wait that no Python handler interrupts. So
`watch` routes every signal through a wakeup socket to a watcher thread, which ends the process at once
there: the run's cleanups (flush the uploads of finished jobs, the timings) get `CLEANUP_S`, then the
process exits 75 (SIGTERM/SIGUSR1) or 130 (SIGINT).

Launcher death: a torchrun worker lives in a session of its own, so a `kill -9` of its launcher's process
group leaves it running. `watch` sets a parent-death signal (SIGTERM, Linux `prctl`) and the watcher also
polls the parent pid: the death is a stop request like SIGTERM, and a rank inside a job that has not
stopped within `LAUNCHER_GRACE_S` exits 75 anyway.

A stop cannot fail once begun: `end` says why, runs the cleanups and flushes on a thread of its own and
exits within `END_BOUND_S` whatever they do (raise, hang, write to a pipe whose reader died with the
launcher), and no lock is ever waited on for good (a second `end`, from a thread or a later signal, exits
by itself after that bound). Its messages, like the watcher's, drop silently on a dead stream; `gen run`
makes its standard streams do the same (`runner/streams.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from genbatch.runner.streams import say

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
EXIT_STATUS = {signal.SIGUSR1: 75, signal.SIGTERM: 75, signal.SIGINT: 130}
"""The exit status of a rank that a signal ends outside a job (75 = exit_codes.REQUEUE; 130 = 128 + SIGINT)."""
LAUNCHER_PID_ENV = "GENBATCH_LAUNCHER_PID"
"""Set by `gen run --nproc` for its workers: the process whose death ends them."""
LAUNCHER_GRACE_S = 8.0
"""Seconds a rank inside a job has, after its launcher died, to stop at a step boundary and checkpoint."""
CLEANUP_S = 5.0
"""Seconds the cleanups (`on_exit`) get when a signal ends a waiting rank."""
END_BOUND_S = CLEANUP_S + 2.0
"""The most seconds `end()` takes to exit, whatever its message, cleanups or streams do meanwhile."""
POLL_S = 0.25
"""How often the watcher looks at the parent pid."""
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class StopRequest:
    """Set by a signal handler; read at step boundaries (and, once watched, acted on in waiting regions)."""

    signal_number: int | None = None
    """The stop signal received (None: none yet)."""
    _previous: dict = field(default_factory=dict, repr=False)
    """The handlers this request replaced (left out of the repr: each may be an earlier request's, whose repr
    would hold its own predecessors', three signals each: repeated in-process runs made it exponential)."""
    _waiting: list = field(default_factory=list)
    """Names of the waiting regions the main thread is in (innermost last)."""
    _cleanups: list = field(default_factory=list)
    _watcher: "_Watcher | None" = None

    @property
    def requested(self) -> bool:
        return self.signal_number is not None

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self._watcher is not None and self._waiting:
                return  # the watcher thread ends the process with 130
            raise KeyboardInterrupt
        self.signal_number = signum

    def install(self) -> "StopRequest":
        """Route SIGUSR1 and SIGTERM to this request (only from the main thread; call `restore` after)."""
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        self.unwatch()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def watch(self, parent_pid: int | None = None, grace_s: float = LAUNCHER_GRACE_S) -> "StopRequest":
        """End the process on a signal in a `waiting` region, and when `parent_pid` (the launcher) dies.
        From the main thread, after `install`; `unwatch` (or `restore`) undoes it."""
        if self._watcher is None:
            self._previous.setdefault(signal.SIGINT, signal.signal(signal.SIGINT, self._handle))
            self._watcher = _Watcher(self, parent_pid, grace_s)
        return self

    def unwatch(self) -> None:
        """Signals only set the flag from here on; after a launcher's death its deadline still holds."""
        if self._watcher is not None and self._watcher.deadline is None:
            self._watcher.close()
            self._watcher = None

    def on_exit(self, cleanup: Callable[[], object]) -> None:
        """Run `cleanup` (e.g. flush the uploads) before a signal ends a waiting rank."""
        self._cleanups.append(cleanup)

    @contextlib.contextmanager
    def waiting(self, what: str):
        """A region outside any job (a rendezvous, a broadcast, a hand-out): once watched, a stop signal
        ends the process here, also while it is blocked in a C++ wait. A stop already requested ends it on
        entry (nothing is left to checkpoint)."""
        self._waiting.append(what)
        try:
            if self._watcher is not None and self.requested:
                self.end(EXIT_STATUS[self.signal_number], f"{signal.Signals(self.signal_number).name} "
                                                          f"received before {what}")
            yield
        finally:
            self._waiting.pop()

    @property
    def waiting_for(self) -> str | None:
        """The outermost waiting region (the most specific name: `gen run` names the broadcasts it makes)."""
        return self._waiting[0] if self._waiting else None

    def end(self, status: int, reason: str, cleanup: bool = True) -> NoReturn:
        """End the process now with `status` (from any thread): the message, the cleanups (at most CLEANUP_S)
        and the flush of the streams run on a thread of their own, so nothing they raise or wait for can keep
        this call from `os._exit` (no interpreter finalization: see parallel/teardown.py). The first caller
        ends the process; a later one (another thread, a second signal) waits at most END_BOUND_S for it and
        then exits itself."""
        try:
            if _ENDING.acquire(blocking=False):  # never released: the process ends
                closing = threading.Thread(target=self._close, args=(status, reason, cleanup),
                                           name="genbatch-stop", daemon=True)
                closing.start()
                closing.join(END_BOUND_S)
            else:
                time.sleep(END_BOUND_S)
        finally:
            os._exit(status)

    def _close(self, status: int, reason: str, cleanup: bool) -> None:
        """What a stop does before the exit: say why and that a rerun continues (every stop keeps the run's state:
        a signal's, a launcher's death), run the cleanups, flush what was written."""
        say(f"genbatch: {reason}; exiting with status {status}: rerun the same command to continue")
        if cleanup and self._cleanups:
            worker = threading.Thread(target=self._run_cleanups, name="genbatch-stop-cleanup", daemon=True)
            worker.start()
            worker.join(CLEANUP_S)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    def _run_cleanups(self) -> None:
        for cleanup in self._cleanups:
            try:
                cleanup()
            except Exception as error:  # noqa: BLE001 - the exit goes on; say what was lost
                say(f"genbatch: while stopping: {error}")

    def agreed(self, group, device) -> bool:
        """True on every rank of `group` (a `Comm`) when any of them was signalled: one blocking all-reduce
        (between jobs; inside the denoise loop `runner.agreement.StopAgreement` spaces them out)."""
        if group.size == 1:
            return self.requested
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=device)
        group.all_reduce(flag, op=dist.ReduceOp.MAX, kind="control")
        return bool(flag.item())


_ENDING = threading.Lock()
"""Taken by the first `end()`, never released: whoever holds it is bound to exit (see `end`)."""


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_pid() -> int | None:
    """The process whose death ends this rank: `gen run --nproc`'s launcher, or torchrun's agent (the parent
    of a torchrun worker); None for a process that no launcher started."""
    if LAUNCHER_PID_ENV in os.environ:
        return int(os.environ[LAUNCHER_PID_ENV])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return os.getppid()
    return None


class _Watcher:
    """The thread that reads the signals from the wakeup socket and watches the parent pid."""

    def __init__(self, request: StopRequest, parent_pid: int | None, grace_s: float):
        self.request, self.parent_pid, self.grace_s = request, parent_pid, grace_s
        self.deadline: float | None = None
        self._closed = threading.Event()
        self._reader, self._writer = socket.socketpair()
        self._reader.settimeout(POLL_S)
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        if parent_pid is not None:
            set_parent_death_signal(signal.SIGTERM)  # first, then look: a death in between is seen below
        self._thread = threading.Thread(target=self._run, name="genbatch-stop-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        signal.set_wakeup_fd(self._previous_fd)
        self._thread.join(2 * POLL_S)
        self._reader.close()
        self._writer.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._reader.recv(64)
            except (TimeoutError, socket.timeout):
                data = b""
            except OSError:
                return  # closed
            if self._closed.is_set():
                return
            try:
                for signum in data:
                    self._on_signal(signum)
                self._check_parent()
            except Exception as error:  # noqa: BLE001 - the watcher must outlive anything it meets
                say(f"genbatch: the stop watcher went on after an error: {error!r}")

    def _on_signal(self, signum: int) -> None:
        if signum not in EXIT_STATUS:
            return
        if signum != signal.SIGINT and self.request.signal_number is None:
            self.request.signal_number = signum  # the main thread's handler may not have run yet
        where = self.request.waiting_for
        if where is not None:
            self.request.end(EXIT_STATUS[signum], f"{signal.Signals(signum).name} received during {where}")

    def _check_parent(self) -> None:
        if self.parent_pid is None:
            return
        if self.deadline is None and os.getppid() != self.parent_pid:
            self.deadline = time.monotonic() + self.grace_s
            if self.request.signal_number is None:
                self.request.signal_number = signal.SIGTERM
            where = self.request.waiting_for
            if where is not None:
                self.request.end(75, f"the launcher (pid {self.parent_pid}) died during {where}")
            say(f"genbatch: the launcher (pid {self.parent_pid}) died; stopping at the next step boundary "
                f"(at most {self.grace_s:g} s)")
        elif self.deadline is not None:
            where = self.request.waiting_for
            if where is not None:
                self.request.end(75, f"the launcher (pid {self.parent_pid}) died; stopped during {where}")
            if time.monotonic() > self.deadline:
                self.request.end(75, f"the launcher (pid {self.parent_pid}) died and the job did not stop "
                                     f"within {self.grace_s:g} s", cleanup=False)
