"""Python warnings of genbatch's own making, found in a process's stderr.

A warning is genbatch's when genbatch's code raised it, or called the API that did (a deprecated torch call,
as `all_gather_into_tensor` once was from parallel/comm.py). Python prints a warning as `FILE:LINE: CATEGORY:
MESSAGE` with FILE the frame it is charged to, which is genbatch's file only when the API's `stacklevel` points
there: torch 2.13 charges that FutureWarning to its own c10d_logger.py. So a run whose stderr is to be read this
way starts with the probe on its path (`probe_env`: tests/support/warning_probe/sitecustomize.py), which follows
each printed warning with the frame that raised it and the frame that called what raised it. A library's own
warnings (torchao's on import) are neither raised nor called by genbatch's code, and do not count."""

from __future__ import annotations

import os
import re

import genbatch

PACKAGE = os.path.dirname(os.path.abspath(genbatch.__file__))
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warning_probe")
PROBE_ON = "warning-probe: on"  # the lines the probe writes (it imports nothing of the tests': it runs first)
_PRINTED = re.compile(r"^(?P<file>\S[^:\n]*\.py):(?P<line>\d+): (?P<category>\w*Warning): .*$", re.MULTILINE)
_ORIGIN = re.compile(r"^warning-origin: issuer=(?P<issuer>.+?) caller=(?P<caller>.+?) (?P<category>\w*Warning): .*$",
                     re.MULTILINE)


def probe_env(pythonpath: str) -> dict[str, str]:
    """The environment that puts the warning probe on the path after `pythonpath` (every process inherits it)."""
    return {"PYTHONPATH": os.pathsep.join((pythonpath, PROBE))}


def probed_processes(stderr: str) -> int:
    """How many processes of the run the probe started in (each says so once)."""
    return stderr.count(PROBE_ON)


def _genbatchs(where: str) -> bool:
    """Whether `where` (FILE or FILE:LINE) is a file of the genbatch package."""
    path = os.path.abspath(where.rsplit(":", 1)[0] if re.search(r":\d+$", where) else where)
    return path == PACKAGE or path.startswith(PACKAGE + os.sep)


def genbatch_warnings(stderr: str) -> list[str]:
    """Each warning in `stderr` of genbatch's making: the printed line when it is charged to genbatch's file,
    the probe's line when genbatch's code raised it or called what did."""
    charged = [match.group(0) for match in _PRINTED.finditer(stderr) if _genbatchs(match.group("file"))]
    traced = [match.group(0) for match in _ORIGIN.finditer(stderr)
              if _genbatchs(match.group("issuer")) or _genbatchs(match.group("caller"))]
    return charged + traced
