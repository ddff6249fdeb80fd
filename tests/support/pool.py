"""Pools of gloo ranks kept for the whole test session: one pool per world size, spawned on first use.

    pool = rank_pool(2)
    results = pool.run(my_check, args=(...,), timeout_s=30)     # results[rank] = my_check(rank, 2, *args)

A pool starts its ranks once: each is forked from one fork server that imported torch, diffusers and genbatch
for the whole session (tests/support/preload.py; a pool of 8 starts in about 3 s, not 15 s), takes the
environment and working directory of the pool's user, joins one process group and then serves calls. A call
goes by reference: the function is pickled by its qualified name (it must be a module-level function), its
arguments and results by value. After each call
every rank puts itself back as it was, and says what it could not (that fails the call that left it):

    a barrier                 every rank has finished the call
    compilation               `torch._dynamo.reset()`: no compiled graph or guard outlives its test
    signals                   every handler as it was, no wakeup fd
    environment, cwd          as they were at spawn
    torch's global state      threads (1), default dtype, grad mode, the default generator's seed

The process groups a call made (a mesh's, `new_group`'s) are kept, not destroyed: DTensor caches output
shardings by their inputs' specs, whose meshes compare by layout, so a later call's equal mesh can be handed
a spec holding an earlier mesh, whose groups must then still work. A pool whose ranks hold more than
MAX_GROUPS groups is respawned after the call that passed the bound, so their sockets stay bounded. All of
a rank's groups share one gloo transport device, so the groups kept cost an idle pool no CPU.

A call whose rank raises, hangs past `4 x timeout_s` (plus 2 s), dies or leaves something it cannot undo (its
default process group destroyed) fails with every rank's traceback (a hung rank's stacks, dumped by
faulthandler), and the pool is respawned on its next use. The gloo timeout of the default group and of the
groups a call makes is the call's `timeout_s`, so a hang fails in seconds.

Tests of processes themselves (signals, kills, exit statuses, a launcher's death, teardown) do not use
a pool: `tests.support.distributed.run_on_fresh_ranks` starts new processes for them.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import signal
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MAX_GROUPS = 400
"""Process groups a rank may hold before its pool is respawned: each holds a socket per peer and two sleeping
gloo worker threads (their transport's polling thread is the rank's one shared device: see `_share_one_device`)."""
SPAWN_TIMEOUT_S = 180.0
"""Seconds a pool's ranks get to start and join their process group (imports on a loaded 2-core machine)."""


def _catchable_signals() -> list[int]:
    return [signum for signum in signal.valid_signals() if signum not in (signal.SIGKILL, signal.SIGSTOP)]


class _RankState:
    """What a rank restores after each call (see the top)."""

    def __init__(self):
        import torch.distributed.distributed_c10d as c10d

        self.c10d = c10d
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.handlers = {signum: signal.getsignal(signum) for signum in _catchable_signals()}
        self.seed = torch.initial_seed()

    def restore(self) -> str | None:
        """Put the rank back; the message of what could not be undone, or None."""
        if not dist.is_initialized():
            return "the call destroyed the default process group"
        gc.collect()
        dist.barrier()
        torch._dynamo.reset()
        signal.set_wakeup_fd(-1)
        for signum, handler in self.handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.manual_seed(self.seed)  # a fresh process's generator: tests may count on every rank having it
        return None

    def groups(self) -> int:
        return len(self.c10d._world.pg_map)


def _share_one_device(c10d) -> None:
    """Every gloo group this rank makes from now on uses one transport device. By default each group makes its
    own, with a polling thread that wakes every few milliseconds: two ranks idling with 100 groups each spent
    0.8 s of CPU in 5 s, and 0.03 s with one shared device (gloo lets contexts share a device)."""
    from torch._C._distributed_c10d import ProcessGroupGloo

    device = ProcessGroupGloo.create_default_device()

    class SharedDeviceGloo(ProcessGroupGloo):
        def __init__(self, store, rank: int, size: int, timeout: timedelta = timedelta(minutes=30)):
            options = ProcessGroupGloo._Options()
            options._devices = [device]
            options._timeout = timeout
            options._threads = 2  # gloo's default
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = SharedDeviceGloo


def _set_timeout(c10d, seconds: float) -> None:
    """`seconds` for the default group and every group made from now on (gloo's default would be 30 min)."""
    timeout = timedelta(seconds=seconds)
    c10d._set_pg_timeout(timeout)
    c10d._get_default_timeout = lambda backend: timeout


def _send(conn, reply: tuple) -> None:
    try:
        data = pickle.dumps(reply)
    except Exception:  # noqa: BLE001 - an unpicklable result is the call's error
        data = pickle.dumps(("error", "the result could not be pickled:\n" + traceback.format_exc()))
    conn.send_bytes(data)


def _serve(rank: int, world_size: int, port: int, conn, dump_path: str, environ: dict, cwd: str) -> None:
    os.environ.clear()  # the pool's user's, not the fork server's (started by an earlier pool, maybe elsewhere)
    os.environ.update(environ)
    os.chdir(cwd)
    import torch.distributed.distributed_c10d as c10d

    from tests.support.distributed import join_world

    _share_one_device(c10d)
    join_world(rank, world_size, port, timeout_s=60)
    state = _RankState()
    dump = open(dump_path, "w")
    _send(conn, ("ready", None))
    while True:
        try:
            task = pickle.loads(conn.recv_bytes())
        except EOFError:
            break
        if task is None:
            break
        fn, args, timeout_s = task
        _set_timeout(state.c10d, timeout_s)
        faulthandler.dump_traceback_later(3 * timeout_s, file=dump)
        try:
            reply = ("ok", fn(rank, world_size, *args))
        except BaseException:  # noqa: BLE001 - every failure must reach the parent
            reply = ("error", traceback.format_exc())
        faulthandler.cancel_dump_traceback_later()
        _send(conn, reply)
        if reply[0] != "ok":
            break  # the pool is respawned: what the failed call left here cannot be trusted
        del task, fn, args, reply  # nothing of the call outlives it here (its tensors hold its meshes)
        try:
            problem = state.restore()
        except BaseException:  # noqa: BLE001
            problem = "putting the rank back failed:\n" + traceback.format_exc()
        _send(conn, ("ready", problem, state.groups() > MAX_GROUPS))
        if problem is not None:
            break
    from genbatch.parallel.teardown import exit_process

    exit_process(0)


def _fork_server():
    """The start method of pool ranks: forked from one server that imported torch, diffusers and genbatch once
    (tests/support/preload.py), so a pool of 8 starts in about 3 s, not after 8 x 3.5 s of imports. Each rank
    then takes the environment and working directory of the pool's user, as a spawned rank would."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["tests.support.preload"])
    return context


class RankPool:
    """`world_size` gloo ranks serving calls (see the top)."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._processes, self._conns, self._dumps = [], [], []
        self._folder = None

    def _spawn(self) -> None:
        from tests.support.distributed import free_port

        context = _fork_server()
        self._folder = tempfile.TemporaryDirectory(prefix=f"pool{self.world_size}-")
        port = free_port()
        for rank in range(self.world_size):
            ours, theirs = context.Pipe()
            dump = os.path.join(self._folder.name, f"rank{rank}.stacks")
            process = context.Process(target=_serve, daemon=True, name=f"pool{self.world_size}-rank{rank}",
                                      args=(rank, self.world_size, port, theirs, dump, dict(os.environ), os.getcwd()))
            process.start()
            theirs.close()
            self._processes.append(process)
            self._conns.append(ours)
            self._dumps.append(dump)
        replies = self._replies(time.monotonic() + SPAWN_TIMEOUT_S)
        if any(reply is None or reply[0] != "ready" for reply in replies):
            self.close()
            raise AssertionError(f"a pool of {self.world_size} gloo ranks did not start: {replies}")

    def _replies(self, deadline: float) -> list:
        """One reply per rank, None for a rank that died or did not answer by `deadline`."""
        from multiprocessing.connection import wait

        replies = [None] * self.world_size
        waiting = dict(zip(self._conns, range(self.world_size)))
        while waiting and time.monotonic() < deadline:
            for conn in wait(list(waiting), timeout=max(0.0, deadline - time.monotonic())):
                rank = waiting.pop(conn)
                try:
                    replies[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    pass
        return replies

    def run(self, fn, args: tuple = (), timeout_s: float = 30.0) -> list:
        """`fn(rank, world_size, *args)` on every rank; the results by rank."""
        if not self._processes or not all(process.is_alive() for process in self._processes):
            self.close()
            self._spawn()
        try:
            payload = pickle.dumps((fn, args, timeout_s))
            for conn in self._conns:
                conn.send_bytes(payload)
            deadline = time.monotonic() + 4 * timeout_s + 2
            replies = self._replies(deadline)
            if all(reply is not None and reply[0] == "ok" for reply in replies):
                cleaned = self._replies(deadline + 60)
                problems = [f"--- rank {rank} ---\n{reply[1] if reply else 'no answer'}"
                            for rank, reply in enumerate(cleaned) if reply is None or reply[1] is not None]
                if problems:
                    raise AssertionError(f"{getattr(fn, '__qualname__', fn)} left its ranks in a state the pool "
                                         "cannot undo:\n" + "\n".join(problems))
                if any(reply[2] for reply in cleaned):
                    self.close()  # past MAX_GROUPS: a fresh pool for the next call
                return [reply[1] for reply in replies]
            raise AssertionError("distributed run failed:\n" + "\n".join(self._errors(replies)))
        except BaseException:
            self.close(grace_s=0.2)  # respawned by the next call
            raise

    def _errors(self, replies: list) -> list[str]:
        errors = []
        for rank, reply in enumerate(replies):
            if reply is not None and reply[0] == "error":
                errors.append(f"--- rank {rank} ---\n{reply[1]}")
            elif reply is None:
                stacks = ""
                if os.path.exists(self._dumps[rank]):
                    with open(self._dumps[rank]) as handle:
                        stacks = handle.read()
                errors.append(f"--- rank {rank}: no answer (hung or died) ---\n{stacks or '(no stacks dumped)'}")
        return errors

    def close(self, grace_s: float = 2.0) -> None:
        """Ask every rank to end, and kill one still alive after `grace_s` (a rank of a failed call may be hung:
        nothing it does is waited for)."""
        for conn in self._conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + grace_s
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self._conns:
            conn.close()
        self._processes, self._conns, self._dumps = [], [], []
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None


_POOLS: dict[int, RankPool] = {}


def rank_pool(world_size: int) -> RankPool:
    """The session's pool of `world_size` ranks (spawned on its first call)."""
    return _POOLS.setdefault(world_size, RankPool(world_size))


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def pool_processes() -> list[int]:
    """Pids of every pool rank alive now (for tests of the pools)."""
    return [process.pid for pool in _POOLS.values() for process in pool._processes if process.is_alive()]

