"""Run a launcher and report how the processes it started end, after it has been killed.

    python -m tests.support.reaper FD COMMAND...   # writes to file descriptor FD the launcher's pid, then
                                                   # a line per process that ends: "PID STATUS MONOTONIC_SECONDS"

The reaper is a child subreaper (Linux `prctl(PR_SET_CHILD_SUBREAPER)`): when the launcher dies, its
children (the ranks) become the reaper's, so their exit statuses can be read, which no other process could
do once their parent is gone. It exits when the launcher and every process left to it have ended. `MONOTONIC_SECONDS` is the system-wide
monotonic clock at the rank's end, for the test to compare with the moment it killed the launcher.
The launcher inherits the reaper's standard streams (so a test can hand it a closed pipe).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    fd, command = int(sys.argv[1]), sys.argv[2:]
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    report = os.fdopen(fd, "w")  # the test's pipe for the report (stdout and stderr may be closed pipes)
    launcher = subprocess.Popen(command, start_new_session=True)
    report.write(f"{launcher.pid}\n")
    report.flush()
    while True:
        try:
            pid, status = os.wait()  # the launcher, and its children once it is gone
        except ChildProcessError:
            return 0
        report.write(f"{pid} {os.waitstatus_to_exitcode(status)} {time.monotonic()}\n")
        report.flush()


if __name__ == "__main__":
    sys.exit(main())
