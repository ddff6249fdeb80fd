"""Run a function on N gloo processes on this machine, with short timeouts, and collect what each returns.

    results = run_on_ranks(my_check, world_size=4, args=(...,))        # results[rank] is my_check's return value
    results = run_on_fresh_ranks(my_check, world_size=2, args=(...,))  # in new processes (tests of processes)

`fn(rank, world_size, *args)` runs after `init_process_group("gloo")`; it must be a module-level function
(it is pickled by name). A rank that raises fails the call with that rank's traceback; a rank that hangs is
cut off by the gloo timeout (seconds, not the 30-minute default) and the call fails.

`run_on_ranks` runs on the session's pool of that world size (tests/support/pool.py: spawned once, put back
after each call). `run_on_fresh_ranks` spawns the ranks for the call, for a test about processes (a rank
that dies, signals, exit statuses); each ends through `genbatch.parallel.teardown.exit_process`, like
`gen run`, so a finished rank never dies on its way out.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genbatch.parallel.teardown import exit_process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def join_world(rank: int, world_size: int, port: int, timeout_s: float) -> None:
    """Make this process rank `rank` of a gloo world on loopback `port`, as torchrun's environment would, with
    one thread (the ranks share the machine's cores)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


def _worker(rank, world_size, port, timeout_s, result_dir, fn, args):
    path = os.path.join(result_dir, f"rank{rank}.pkl")
    status = 0
    try:
        join_world(rank, world_size, port, timeout_s)
        result = fn(rank, world_size, *args)
        with open(path, "wb") as handle:
            pickle.dump(("ok", result), handle)
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        status = 1
        with open(path, "wb") as handle:
            pickle.dump(("error", traceback.format_exc()), handle)
        traceback.print_exc()
    # as `gen run` does: end without the interpreter's finalization, which can abort (parallel/teardown.py)
    exit_process(status)


def run_on_ranks(fn, world_size: int, args: tuple = (), timeout_s: float = 30.0) -> list:
    """Run `fn(rank, world_size, *args)` on the session's pool of `world_size` gloo ranks; their results by
    rank."""
    from tests.support.pool import rank_pool

    return rank_pool(world_size).run(fn, args, timeout_s)


def _join_every_rank(context, timeout_s: float) -> None:
    """Wait for each rank to end on its own (no rank is terminated because a peer failed), then fail as
    `context.join` would, naming the first rank that did not exit 0."""
    for process in context.processes:
        process.join(timeout_s)
        if process.is_alive():
            process.kill()
            process.join()
    for index, process in enumerate(context.processes):
        if process.exitcode:
            raise RuntimeError(f"process {index} terminated with exit code {process.exitcode}")


def run_on_fresh_ranks(fn, world_size: int, args: tuple = (), timeout_s: float = 30.0,
                       survivors_finish: bool = False) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` new gloo processes; return their results by rank.

    A rank that fails makes the others be terminated at once, unless `survivors_finish`: then each rank
    runs to its own end (a test of what the survivors of a lost rank do)."""
    with tempfile.TemporaryDirectory() as result_dir:
        context = mp.start_processes(
            _worker,
            args=(world_size, free_port(), timeout_s, result_dir, fn, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        try:
            if survivors_finish:
                _join_every_rank(context, timeout_s * 4)
            while not context.join(timeout=timeout_s * 4):
                pass
        except Exception as exc:  # a rank failed: report every rank's error
            errors = []
            for rank in range(world_size):
                path = os.path.join(result_dir, f"rank{rank}.pkl")
                if os.path.exists(path):
                    status, value = pickle.load(open(path, "rb"))
                    if status == "error":
                        errors.append(f"--- rank {rank} ---\n{value}")
            raise AssertionError("distributed run failed:\n" + "\n".join(errors or [str(exc)])) from None
        results = []
        for rank in range(world_size):
            with open(os.path.join(result_dir, f"rank{rank}.pkl"), "rb") as handle:
                status, value = pickle.load(handle)
            results.append(value)
        return results
