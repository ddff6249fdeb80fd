"""In-process helpers for the step-checkpoint tests: an executor on a real RunStore, a timer that delivers a
real signal after a chosen step, and a store that records the checkpoints it is asked to save."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import torch

from genbatch.io import BackgroundWriter, RunStore
from genbatch.runner.checkpoint import CheckpointPolicy
from genbatch.runner.checkpoint import DenoiseCheckpoint
from genbatch.runner.execute import JobExecutor
from genbatch.runner.options import RunOptions
from genbatch.runner.startup import build_executor
from genbatch.runner.timing import JobTimer
from genbatch.runner.world import start_world


class RecordingStore(RunStore):
    """A RunStore that also remembers, per job, the `steps_done` of every checkpoint it saved."""

    def __init__(self, url: str):
        super().__init__(url)
        self.saved: dict[str, list[int]] = {}

    def save_checkpoint(self, job_id: str, payload: bytes) -> None:
        super().save_checkpoint(job_id, payload)
        self.saved.setdefault(job_id, []).append(DenoiseCheckpoint.from_bytes(payload).steps_done)


class SignalAfterStep(JobTimer):
    """A job timer that sends this process `signum` once denoising step `step` (0-based) has been timed,
    i.e. while the job runs, before the executor's step-boundary check; optionally sleeps in every step."""

    def __init__(self, device: torch.device, step: int | None = None, signum: int = signal.SIGUSR1,
                 step_sleep_s: float = 0.0):
        super().__init__(device)
        self.signal_step, self.signum, self.step_sleep_s = step, signum, step_sleep_s
        self.boundaries: list[float] = []
        """time.monotonic() at the end of each step run (what the executor's clock reads there)."""

    def add(self, stage: str, start, end, step: int | None = None, **extra) -> None:
        if stage == "denoise_step" and self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        super().add(stage, start, end, step=step, **extra)
        if stage == "denoise_step":
            self.boundaries.append(time.monotonic())
            if step == self.signal_step:
                os.kill(os.getpid(), self.signum)

    def steps(self) -> list[int]:
        """The denoising step indices this timer saw, in order."""
        return [interval.step for interval in self.intervals if interval.stage == "denoise_step"]


@dataclass(kw_only=True, slots=True)
class Harness:
    executor: JobExecutor
    store: RecordingStore
    writer: BackgroundWriter

    @property
    def device(self) -> torch.device:
        return self.executor.ctx.device


@contextlib.contextmanager
def executor_on(out: str, policy: CheckpointPolicy | None = None):
    """A fresh single-process JobExecutor (its own pipelines) writing to `out`; writes flushed on exit."""
    options = RunOptions.from_flags("unused", out, {
        "media_allow": ("/",), "checkpoints": policy or CheckpointPolicy(every_steps=0, every_seconds=0)})
    world = start_world(options)
    store = RecordingStore(out)
    writer = BackgroundWriter(max_pending=2)
    executor = build_executor(options, world, store, writer, run_id="resume-test")
    try:
        yield Harness(executor=executor, store=store, writer=writer)
    finally:
        executor.stop.restore()
        writer.close()
        world.close()
