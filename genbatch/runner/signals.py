"""Preemption: SIGUSR1 / SIGTERM ask the run to stop at the next denoising-step boundary.

The handler only sets a flag. At each step boundary the ranks of a job group agree on it (one tiny
all-reduce, so every rank stops after the same step), the group checkpoints, and the process exits with
`exit_codes.REQUEUE`. Slurm sends USR1 before a time limit or preemption (`--signal=B:USR1@grace`) and
torchrun forwards SIGTERM to its workers. `gen run` installs the handler before its heavy imports, so a
signal that arrives while it starts up is kept too. (This module imports nothing heavy for that reason.)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


@dataclass(slots=True)
class StopRequest:
    """Set by a signal handler; read at step boundaries."""

    signal_number: int | None = None
    _previous: dict = field(default_factory=dict)

    @property
    def requested(self) -> bool:
        return self.signal_number is not None

    def _handle(self, signum, frame) -> None:
        self.signal_number = signum

    def install(self) -> "StopRequest":
        """Route SIGUSR1 and SIGTERM to this request (only from the main thread; call `restore` after)."""
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def agreed(self, group, device) -> bool:
        """True on every rank of `group` (a `Comm`) when any of them was signalled (all stop after the same
        step)."""
        if group.size == 1:
            return self.requested
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=device)
        group.all_reduce(flag, op=dist.ReduceOp.MAX, kind="control")
        return bool(flag.item())
