"""The exit statuses of `gen run`, which sbatch scripts and schedulers act on."""

OK = 0
"""Every manifest row is done."""
JOBS_FAILED = 1
"""The run finished, but some jobs failed or some rows were rejected (`gen status OUT --failed` lists the failed
jobs and why, rejected/ the rejected rows); the rest is done."""
USAGE = 2
"""Bad options or a manifest that cannot be read at all; nothing was run."""
REQUEUE = 75
"""Interrupted by SIGUSR1/SIGTERM (preemption, time limit): work was checkpointed; requeue and rerun the same
command to continue. 75 is EX_TEMPFAIL from sysexits.h: a temporary failure, try again."""
INTERRUPTED = 130
"""Stopped by SIGINT (Ctrl-C): 128 + the signal's number, as a shell reports it."""


def for_storage_error(error) -> int:
    """The exit status of a `genbatch.io.StorageError`: down past --storage-timeout, REQUEUE (try again later);
    refused for good (access denied, no such bucket), USAGE."""
    return REQUEUE if error.transient else USAGE
