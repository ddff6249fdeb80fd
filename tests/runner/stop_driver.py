"""A rank held where `gen run` can be stopped, through the real code of each place: for the tests of a stop
whose stderr is a closed pipe (tests/runner/test_stop_closed_pipe.py).

    python -m tests.runner.stop_driver PLACE READY_FILE [--cleanups hang,raise] [--grace S]

PLACE is where the rank waits when its launcher dies or a signal comes:
    broadcast     rank 1 in `World.shared_value`, whose rank 0 (a `peer`) never answers
    hand-out      rank 1 of an Ulysses group of 2 in `HandOut`, whose leader (a `peer`) never answers
    final-wait    rank 0 in `World.wait_for_all_ranks`, whose other rank (a `peer`) never finishes
    job           rank 1 inside a job, in a collective its peer never joins (no waiting region: the launcher's
                  grace ends it)
    two-threads   `end()` called by the main thread and another thread at the same moment
    peer          the silent other rank of broadcast, hand-out, final-wait and job (RANK from the environment)

The launcher is the parent process (GENBATCH_LAUNCHER_PID names it, as `gen run --nproc` does). READY_FILE is
written once the rank is in PLACE (the test kills the launcher or signals the rank then). `--cleanups` adds
cleanups that hang or raise, which the stop must get past. (Start-up and the rendezvous are tested on `gen run`
itself.)
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

from genbatch.runner.signals import StopRequest, launcher_pid

WORLD = {"broadcast": "dp=2", "hand-out": "ulysses=2", "final-wait": "dp=2", "job": "ulysses=2"}
"""The layout of each place that has a peer (a peer takes its place's, named by PEER_OF)."""
PEER_OF = "GENBATCH_TEST_PEER_OF"
"""Environment: the place a `peer` is the silent half of."""


def _ready(path: str) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def _context(place: str):
    import torch
    import torch.distributed as dist

    from genbatch.parallel.context import build_context
    from genbatch.parallel.dims import ParallelDims

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    degrees = dict(part.split("=") for part in WORLD[place].split(","))
    return build_context(ParallelDims.infer(2, **{axis: int(degree) for axis, degree in degrees.items()}),
                         torch.device("cpu"))


def _world(ctx, stop):
    import torch

    from genbatch.runner.world import World

    return World(ctx=ctx, dtype=torch.float32, owns_process_group=True, stop=stop)


def hold(place: str, ready: str, stop: StopRequest) -> None:
    """Wait in `place` until the process is ended from outside."""
    if place == "peer":
        _context(os.environ[PEER_OF])
        _ready(ready)
        time.sleep(600)
    elif place == "broadcast":
        world = _world(_context(place), stop)
        _ready(ready)
        world.shared_value(lambda: "never sent")
    elif place == "hand-out":
        from genbatch.runner.handout import HandOut, coordination_store
        from tests.support.runs import job

        ctx = _context(place)
        jobs = [job("tiny-flux", id="a")]
        handout = iter(HandOut(jobs=jobs, ctx=ctx, store=coordination_store(ctx), key="next", stop=stop))
        _ready(ready)
        next(handout)
    elif place == "final-wait":
        from genbatch.runner.handout import coordination_store

        ctx = _context(place)
        world = _world(ctx, stop)
        with stop.waiting("the wait for the other ranks"):
            _ready(ready)
            world.wait_for_all_ranks("run", coordination_store(ctx))
    elif place == "job":
        import torch

        ctx = _context(place)
        _ready(ready)
        ctx.group.all_reduce(torch.ones(4), kind="control")  # no waiting region: only the grace ends it
    elif place == "two-threads":
        both = threading.Barrier(2)

        def other():
            both.wait()
            stop.end(75, "stopped from another thread")

        threading.Thread(target=other, daemon=True).start()
        _ready(ready)
        both.wait()
        stop.end(75, "stopped from the main thread")
    else:
        raise SystemExit(f"unknown place {place!r}")
    raise SystemExit(f"{place}: the wait returned")  # never reached while the peer stays silent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("place")
    parser.add_argument("ready")
    parser.add_argument("--cleanups", default="")
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args()
    stop = StopRequest().install()
    if args.place != "peer":
        stop.watch(parent_pid=launcher_pid(), grace_s=args.grace)
    for kind in filter(None, args.cleanups.split(",")):
        stop.on_exit({"hang": lambda: time.sleep(600), "raise": lambda: 1 / 0}[kind])
    hold(args.place, args.ready, stop)


if __name__ == "__main__":
    main()
