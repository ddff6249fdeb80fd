"""`gen run --nproc N`: start N workers on this machine with torchrun's launcher and return one status.

Workers run `python -m genbatch run ...` (the same command without --nproc). SIGTERM to the launcher is
forwarded to the workers by torchrun's agent; SIGUSR1 is turned into the same. The workers run in sessions
of their own (torchrun starts them so), so they watch this process instead: when it dies, even by `kill -9`
of its process group, they checkpoint and end within seconds (runner/signals.py). Exit status: 75 when the
workers stopped with their state checkpointed (a signal, or a group that failed and recorded it), else the
most severe worker status.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid

from genbatch.jobs import exit_codes


def _threads_per_worker(nproc: int) -> str:
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))


_STATUSES_SAID = (exit_codes.JOBS_FAILED, exit_codes.USAGE, exit_codes.REQUEUE)
"""Worker exit statuses genbatch itself chose and explained (failed rows, a usage error, a stop)."""


def _quiet_agent() -> None:
    """Keep the agent's log to what genbatch has not said: its ERROR line for a worker that ended with one of
    genbatch's own statuses (`failed (exitcode: 1)`, which reads like a crash), and its notice that it ends the
    other workers then, are dropped; a worker killed by a signal or crashing is still logged."""
    import logging

    said = tuple(f"failed (exitcode: {status})" for status in _STATUSES_SAID)

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(said) or "closing signal SIGTERM" in message)

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(keep)


def launch_local(nproc: int, args: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from genbatch.runner.signals import LAUNCHER_PID_ENV

    os.environ["OMP_NUM_THREADS"] = _threads_per_worker(nproc)  # this launcher process only exports it
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the workers end when this process dies (even by kill -9)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"genbatch-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    _quiet_agent()
    previous = signal.signal(signal.SIGUSR1, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "genbatch", *args)
        return exit_codes.OK
    except ChildFailedError as failure:
        codes = {info.exitcode for info in failure.failures.values()}
        if exit_codes.USAGE in codes:
            return exit_codes.USAGE
        if exit_codes.REQUEUE in codes or codes <= {-signal.SIGTERM}:
            # a worker checkpointed or recorded its group's failure (the others were torn down): the run
            # stopped and a rerun continues, as the node launcher under Slurm decides too
            return exit_codes.REQUEUE
        return exit_codes.JOBS_FAILED
    except SignalException as stopped:  # torchrun's agent passed the signal on to the workers
        return exit_codes.INTERRUPTED if stopped.sigval == signal.SIGINT else exit_codes.REQUEUE
    finally:
        signal.signal(signal.SIGUSR1, previous)
