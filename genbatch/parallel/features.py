"""The per-job features, in the order their hooks run (`genbatch.parallel.job_hooks`): a job's hooks are started
from this list when it starts, and each feature decides from the job and the run whether it takes part.

    hooks = start_hooks(JobStart(job=..., spec=..., pipe=..., trajectory=..., start_step=..., ctx=..., run=...))

A new per-job feature adds its starter here (and nowhere in the loop): a function of a `JobStart` that returns
its `JobHook`, or None when the job does not use it. The order is the nesting of their branch contexts: the
step cache outermost, then the stale-K/V attention.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from genbatch.parallel.cache import session as step_cache
from genbatch.parallel.job_hooks import JobHook, JobHooks, JobStart
from genbatch.parallel.patch import session as distrifusion
from genbatch.parallel.pipeline import session as pipefusion

Starter = Callable[[JobStart], JobHook | None]

FEATURES: tuple[tuple[str, Starter], ...] = (
    ("step cache", step_cache.start_job),
    ("pipefusion", pipefusion.start_job),
    ("distrifusion", distrifusion.start_job),
)
"""Each feature's name and starter, in hook order."""


def start_hooks(start: JobStart) -> JobHooks:
    """The job's hooks, started in `FEATURES` order (those started before a failing one are closed)."""
    return JobHooks.start([partial(starter, start) for _, starter in FEATURES])
