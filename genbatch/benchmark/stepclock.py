"""One stopwatch for both sides of a comparison: marks at every call of the pipeline's transformer.

A step's time is the interval between the first transformer calls of two consecutive steps, so it holds
everything a step does (both guidance branches, the combine, the scheduler, the loop's own bookkeeping)
whichever loop runs it. On CUDA the marks are events recorded on the stream (no synchronisation, nothing
added to the step); on the CPU they are perf_counter readings.

The transformer is found without access to the pipeline object: a global forward pre-hook waits for the
first call of a module of the given class, then moves to a hook on that module alone.

It also samples the device's peak allocated memory around every transformer call, because genbatch's VAE
decode resets CUDA's peak counter to measure its own stage: the run's peak is the largest sample.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass(kw_only=True, slots=True)
class StepClock:
    device: torch.device
    module_class: type
    """The transformer's class (e.g. diffusers.WanTransformer3DModel)."""
    marks: list = field(default_factory=list)
    """One per transformer call: a CUDA event, or perf_counter seconds."""
    peak_samples: list[int] = field(default_factory=lambda: [0])
    _handles: list = field(default_factory=list)

    def __enter__(self) -> "StepClock":
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._handles.append(register_module_forward_pre_hook(self._find))
        return self

    def __exit__(self, *exc) -> None:
        self.sample_peak()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _find(self, module, args):
        if isinstance(module, self.module_class):
            for handle in self._handles:
                handle.remove()
            self._handles[:] = [module.register_forward_pre_hook(self._mark),
                                module.register_forward_hook(self._after)]
            self._mark(module, args)

    def _mark(self, module, args) -> None:
        self.sample_peak()
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def _after(self, module, args, output) -> None:
        self.sample_peak()

    def sample_peak(self) -> None:
        if self.device.type == "cuda":
            self.peak_samples.append(torch.cuda.max_memory_allocated(self.device))

    def step_periods(self, *, jobs: int, steps: int) -> list[float]:
        """Seconds from each step's first transformer call to the next step's (steps - 1 per job)."""
        if not self.marks or len(self.marks) % (jobs * steps):
            raise ValueError(f"{len(self.marks)} transformer calls do not split into {jobs} jobs x {steps} steps; "
                             "every job of a comparison must have the same number of steps")
        branches = len(self.marks) // (jobs * steps)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        periods = []
        for job in range(jobs):
            starts = [self.marks[(job * steps + step) * branches] for step in range(steps)]
            for first, second in zip(starts, starts[1:], strict=False):
                if self.device.type == "cuda":
                    periods.append(first.elapsed_time(second) / 1000.0)
                else:
                    periods.append(second - first)
        return periods

    @staticmethod
    def per_step(periods: list[float]) -> float:
        return statistics.median(periods)
