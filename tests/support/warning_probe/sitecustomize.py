"""Where each printed warning came from, for the tests that read a `gen run`'s stderr for warnings of genbatch's
own making. On PYTHONPATH (`tests.support.own_warnings.probe_env`), Python imports this module at start-up in
every process of the run (the launcher, torchrun's workers); it says so once (`PROBE_ON`), then follows each
warning Python prints with one line:

    warning-origin: issuer=FILE:LINE caller=FILE:LINE CATEGORY: MESSAGE

`issuer`: the innermost frame outside the warnings machinery, the code that warned (for a deprecated collective,
torch's c10d wrapper); `caller`: the first frame out from it in another top-level package, the code that called
what warned (genbatch/parallel/comm.py). The file Python prints a warning under is often neither: torch 2.13
charges `all_gather_into_tensor`'s FutureWarning to its own c10d_logger.py. A library that warns while it is
imported has importlib as its caller, whoever imported it."""

from __future__ import annotations

import os
import sys
import warnings

PROBE_ON = "warning-probe: on"
ORIGIN = "warning-origin:"
MACHINERY = frozenset({"warnings", "typing_extensions", "functools", "contextlib"})
"""Top-level modules whose frames only pass a warning on (the deprecation decorators, wrappers)."""


def _package(frame) -> str:
    return (frame.f_globals.get("__name__") or "").split(".")[0]


def _where(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "-"


def origin(frame):
    """(issuer, caller) of a warning being shown from `frame` (see the module's docstring); either may be None."""
    while frame is not None and (frame.f_code.co_filename == __file__ or _package(frame) in MACHINERY):
        frame = frame.f_back
    issuer, package = frame, _package(frame) if frame is not None else ""
    while frame is not None and (_package(frame) == package or _package(frame) in MACHINERY):
        frame = frame.f_back
    return issuer, frame


_show = warnings.showwarning


def _show_with_origin(message, category, filename, lineno, file=None, line=None):
    _show(message, category, filename, lineno, file, line)
    issuer, caller = origin(sys._getframe(1))
    text = str(message).splitlines()[0] if str(message) else ""
    try:
        (file or sys.stderr).write(f"{ORIGIN} issuer={_where(issuer)} caller={_where(caller)} "
                                   f"{category.__name__}: {text}\n")
    except (OSError, ValueError, AttributeError):  # no stream to write to: as Python's own showwarning
        pass


warnings.showwarning = _show_with_origin
try:
    sys.stderr.write(f"{PROBE_ON} (pid {os.getpid()})\n")
except (OSError, ValueError, AttributeError):
    pass
