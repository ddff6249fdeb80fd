"""When the ranks of a job group agree on "stop?" inside the denoise loop: every k steps, not every step.

An agreement is one all-reduce of a two-number tensor and one read of it on the host: a blocking sync,
which on a GPU drains the launch queue (and a compiled or CUDA-graph step pays for it). So the group agrees
only every `interval` steps, and on the other steps the loop runs without any collective or host read of
its own. The interval is chosen so that a stop still lands within about `target_s` seconds, and within a
tenth of the job's steps (a job of fast steps is still stopped inside, not run to its end):

    at each agreement   all-reduce (MAX) [stop flag, seconds per step since the last agreement]
                        interval = clamp(floor(target_s / slowest rank's seconds per step), 1, max_interval)
                        max_interval = max(1, the job's steps // AGREEMENTS_PER_JOB)

Every rank receives the same reduced values and applies the same rule, so every rank agrees after the same
steps and stops after the same step (a collective's result keyed on identical inputs, principle 5). The
first agreement comes after the first step (whose time includes any warm-up: a safe overestimate). A group
of one never syncs: its flag is a Python bool read at every step boundary.

A stop thus lands at most `interval` steps after the signal: about `target_s` plus one step's time, far
inside Slurm's signal grace (120 s by default) and a dead launcher's `LAUNCHER_GRACE_S`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from genbatch.parallel.comm import Comm
    from genbatch.runner.signals import StopRequest

STOP_AGREEMENT_S = 2.0
"""The aimed-at seconds between two agreements of a job group inside the denoise loop."""
AGREEMENTS_PER_JOB = 10
"""The fewest agreements in a job of many fast steps (the interval is at most its steps over this)."""


@dataclass(kw_only=True, slots=True)
class StopAgreement:
    """Decides, at each step boundary, whether the group stops there; syncs only every `interval` steps."""

    stop: StopRequest
    """The run's stop request (its `requested` flag is this rank's vote)."""
    group: Comm
    """The job group."""
    device: torch.device
    """The device of the agreement's tensor (the group's backend needs it there)."""
    start_step: int = 0
    """steps_done when the loop starts (a resumed job starts past 0)."""
    target_s: float = STOP_AGREEMENT_S
    """Seconds aimed at between agreements."""
    total_steps: int | None = None
    """The job's denoising steps: the interval is at most `total_steps // AGREEMENTS_PER_JOB` (None: no cap)."""
    max_interval: int = 1000
    """The most steps between two agreements (however fast the steps); lowered by `total_steps`."""
    interval: int = 1
    """Steps from the last agreement to the next (the same on every rank)."""
    syncs: int = 0
    """Agreements made so far (each one all-reduce and one blocking host read)."""
    _last_step: int = field(init=False)
    _last_time: float = field(init=False)

    def __post_init__(self) -> None:
        if self.total_steps is not None:
            self.max_interval = max(1, min(self.max_interval, self.total_steps // AGREEMENTS_PER_JOB))
        self._last_step = self.start_step
        self._last_time = time.monotonic()

    def should_stop(self, steps_done: int) -> bool:
        """Called after every step: True on every rank of the group at the same boundary, once any rank was
        asked to stop (at the first agreement after that)."""
        if self.group.size == 1:
            return self.stop.requested
        if steps_done - self._last_step < self.interval:
            return False
        import torch
        import torch.distributed as dist

        seconds_per_step = (time.monotonic() - self._last_time) / (steps_done - self._last_step)
        votes = torch.tensor([1.0 if self.stop.requested else 0.0, seconds_per_step], dtype=torch.float32,
                             device=self.device)
        self.group.all_reduce(votes, op=dist.ReduceOp.MAX, kind="control")
        stop, slowest = votes.tolist()  # the one blocking host read per agreement
        self.syncs += 1
        self.interval = self.next_interval(slowest)
        self._last_step, self._last_time = steps_done, time.monotonic()
        return stop > 0

    def next_interval(self, seconds_per_step: float) -> int:
        """Steps until the next agreement, from the group's slowest seconds per step (the same everywhere)."""
        if not seconds_per_step > 0:
            return self.max_interval
        return max(1, min(self.max_interval, math.floor(self.target_s / seconds_per_step)))
