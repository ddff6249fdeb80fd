"""End a process that ran collectives with the status it chose, never with a crash on the way out.

    leave_process_group()          # destroy the process group (if one is initialised)
    exit_process(status)           # flush and end the process; never returns

Why not just `sys.exit`: torch's gloo backend (seen with torch 2.13) runs collectives on worker threads
that drop each finished work a moment after the caller has woken up. When that drop holds
the last reference to a tensor Python created, it must take the GIL; if the interpreter is finalizing by
then, CPython ends the thread inside a C++ destructor and the process dies of SIGABRT ("terminate called
without an active exception") after all of its work succeeded. `destroy_process_group` does not join
those threads, and a garbage collection does not free the group (torch keeps references to it).
A rank that died this way exits 134 instead of 0: torchrun tears the others down, Slurm marks the task
failed, and a preempted run's exit 75 turns into a failure that is not requeued.

So once a process has joined a process group, it ends with `os._exit` after flushing what it wrote:
finalization is skipped, which is all that was left to run (outputs, markers and timings are written
and closed before `gen run` returns its status).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import torch.distributed as dist

_joined = False
"""Whether this process has left a process group, so `exit_process` skips the interpreter's finalization."""


def leave_process_group() -> None:
    """Destroy the default process group (and every group made from it), if one is initialised."""
    global _joined
    if dist.is_available() and dist.is_initialized():
        _joined = True  # first: a destroy that fails still ran collectives before
        dist.destroy_process_group()


def exit_process(status: int, *, skip_finalization: bool = False) -> NoReturn:
    """End the process with `status`; after collectives, without the finalization that can crash (see top).
    `skip_finalization`: skip it in any case (a measuring process whose results are written and closed: native
    thread pools it used, torch's or Arrow's, can abort their own teardown just the same)."""
    try:
        leave_process_group()
    except Exception as error:  # noqa: BLE001 - a broken group must not take the status with it
        print(f"genbatch: leaving the process group failed ({error}); exiting with status {status}", file=sys.stderr)
    if not _joined and not skip_finalization:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it anyway
            pass
    os._exit(status)
