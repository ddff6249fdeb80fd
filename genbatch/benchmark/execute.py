"""Run a suite: its manifest, then `gen run` once per layout (a fresh process tree each), timed.

Each layout writes a whole genbatch run under OUT/runs/<layout>; its timings table, tagged with the layout,
is what the report is made of. A layout that fails is reported and the next one still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from genbatch.benchmark.layouts import describe, layout_name, run_args, stale
from genbatch.benchmark.suites import Suite
from genbatch.parallel.dims import ParallelDims

HEARTBEAT_S = 30.0
"""Seconds between progress lines while a layout runs."""


@dataclass(kw_only=True, slots=True)
class LayoutRun:
    """One layout's `gen run`, finished."""

    layout: ParallelDims
    url: str
    """The run's folder (OUT/runs/<layout>)."""
    status: int
    """`gen run`'s exit status (0: every job done)."""
    wall_seconds: float
    """From starting the command to its exit: process start, model load, jobs, results."""
    timings: pa.Table
    """The run's timing rows plus `layout` (its name) and `world` (its processes) columns."""
    log_tail: str
    """The end of the command's output (why it failed, when it did)."""


@dataclass(kw_only=True, slots=True)
class SuiteRunner:
    """Runs layouts of a suite against one manifest and model directory."""

    suite: Suite
    manifest_url: str
    model_dir: str
    out: str
    """The report's URL; runs go to OUT/runs/<layout>."""
    storage_args: tuple[str, ...] = ()
    """`--storage-option KEY=VALUE` arguments, passed on to `gen run`."""
    storage_options: dict | None = None
    dtype: str | None = None
    """fp32 / bf16 / fp16 (None: gen run's default for the device)."""
    run_args: tuple[str, ...] = ()
    """More `gen run` arguments for every layout (e.g. `--compile`)."""
    stale_args: tuple[str, ...] = ()
    """More `gen run` arguments for the stale-K/V layouts only (`--warmup-steps W`; `--patches M` reaches only
    PipeFusion's)."""
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    """Where progress lines go."""

    def command(self, layout: ParallelDims) -> list[str]:
        command = [sys.executable, "-m", "genbatch", "run", self.manifest_url, "--out", self.run_url(layout),
                   "--model", self.model_dir, "-q", *run_args(layout), *self.run_args, *self._stale_args(layout)]
        if self.dtype:
            command += ["--dtype", self.dtype]
        for option in self.storage_args:
            command += ["--storage-option", option]
        return command

    def _stale_args(self, layout: ParallelDims) -> list[str]:
        if not stale(layout):
            return []
        pairs = list(zip(self.stale_args[::2], self.stale_args[1::2], strict=True))
        return [arg for flag, value in pairs if flag != "--patches" or layout.pp > 1 for arg in (flag, value)]

    def run_url(self, layout: ParallelDims) -> str:
        return f"{self.out.rstrip('/')}/runs/{layout_name(layout)}"

    def run_all(self, layouts: list[ParallelDims]) -> list[LayoutRun]:
        runs = []
        for index, layout in enumerate(layouts, 1):
            self.say(f"gen bench: [{index}/{len(layouts)}] {describe(layout)}: {self.suite.jobs} jobs ...")
            run = self.run_one(layout)
            runs.append(run)
            if run.status == 0:
                self.say(f"gen bench: [{index}/{len(layouts)}] {layout_name(layout)} done in {run.wall_seconds:.1f} s")
            else:
                self.say(f"gen bench: [{index}/{len(layouts)}] {layout_name(layout)} FAILED (exit {run.status}) after "
                         f"{run.wall_seconds:.1f} s; its output ends:\n{run.log_tail}")
        return runs

    def run_one(self, layout: ParallelDims) -> LayoutRun:
        from genbatch.io import RunStore

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with tempfile.TemporaryFile("w+") as log:
            started = time.perf_counter()
            process = subprocess.Popen(self.command(layout), stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
            try:
                status = self._wait(process, layout, started)
            except BaseException:  # interrupted: the run must not outlive the benchmark
                process.terminate()  # torchrun's agent forwards it to the workers
                process.wait(timeout=60)
                raise
            wall = time.perf_counter() - started
            log.seek(0)
            tail = log.read()[-3000:]
        timings = RunStore(self.run_url(layout), storage_options=self.storage_options).read_timings()
        return LayoutRun(layout=layout, url=self.run_url(layout), status=status, wall_seconds=wall,
                         timings=_tagged(timings, layout), log_tail=tail)

    def _wait(self, process: subprocess.Popen, layout: ParallelDims, started: float) -> int:
        """The run's exit status; a progress line every HEARTBEAT_S seconds until then."""
        while True:
            try:
                return process.wait(timeout=HEARTBEAT_S)
            except subprocess.TimeoutExpired:
                done = self._done_count(layout)
                self.say(f"gen bench:     {layout_name(layout)}: {done}/{self.suite.jobs} jobs done, "
                         f"{time.perf_counter() - started:.0f} s")

    def _done_count(self, layout: ParallelDims) -> int:
        from genbatch.io import RunStore

        try:
            return len(RunStore(self.run_url(layout), storage_options=self.storage_options).done_ids())
        except Exception:  # noqa: BLE001 - progress only; the run itself reports real errors
            return 0


def _tagged(timings: pa.Table, layout: ParallelDims) -> pa.Table:
    """The run's timings with the layout's name and process count on every row (the runner writes the same name
    in its own `layout` column; parts written before it had one leave it empty, so it is set here whole)."""
    rows = timings.num_rows
    if "layout" in timings.column_names:
        timings = timings.drop_columns(["layout"])
    return timings.append_column("layout", pa.array([layout_name(layout)] * rows, pa.string())).append_column(
        "world", pa.array([layout.world_size] * rows, pa.int32())
    )
