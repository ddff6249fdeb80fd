"""Helpers for tests that run genbatch: manifests on disk, a run in this process, a run as a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from genbatch.jobs.spec import JobSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_manifest(path: str, rows: list[dict], row_group_size: int | None = None) -> str:
    """Write rows (dicts) as a Parquet manifest; missing optional columns are left out."""
    columns = sorted({key for row in rows for key in row}, key=lambda c: (c not in ("id", "prompt"), c))
    table = pa.table({column: [row.get(column) for row in rows] for column in columns})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def job(preset: str = "tiny-wan", **fields) -> JobSpec:
    """A resolved job with the preset's small sizes unless given (`model=` may name a saved copy)."""
    from genbatch.models import resolve_model

    defaults = resolve_model(preset).defaults
    video = resolve_model(preset).is_video
    values = dict(
        id="job", prompt="a red fox running through snow", negative_prompt=None, model=preset,
        width=defaults.get("width", 64), height=defaults.get("height", 48),
        num_frames=defaults.get("num_frames", 9) if video else None,
        num_inference_steps=4, guidance_scale=defaults.get("guidance_scale", 5.0), seed=7,
        fps=defaults.get("fps", 8) if video else None, extra={}, row=0,
    )
    values.update(fields)
    return JobSpec(**values)


def gen(*args: str, env: dict | None = None, timeout: float = 240, check: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m genbatch ARGS` in a subprocess (with the repo on the path)."""
    full_env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "genbatch", *args], env=full_env, capture_output=True, text=True,
        timeout=timeout, check=check,
    )


def start_gen(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start `python -m genbatch ARGS` without waiting (for kill and signal tests)."""
    full_env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "genbatch", *args], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


class CliResult:
    """What `run_cli` returns: the fields tests read from a CompletedProcess."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_cli(*args: str) -> CliResult:
    """Run the `gen` command in this process (no interpreter start-up: much faster than `gen()`)."""
    from click.testing import CliRunner

    from genbatch.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


def _run_cli_rank(rank: int, world_size: int, args: tuple[str, ...]) -> CliResult:
    """The `gen` command on one rank of a pool (tests/support/pool.py), whose process group the run joins; the
    status it would end the process with is returned instead (the pool's rank lives on)."""
    from unittest import mock

    import genbatch.parallel.teardown as teardown

    with mock.patch.object(teardown, "exit_process", sys.exit):
        return run_cli(*args)


def run_cli_on_ranks(world_size: int, *args: str, timeout_s: float = 120.0) -> CliResult:
    """`gen ARGS` as `gen ARGS --nproc WORLD_SIZE` runs it, each rank in-process on the session's pool of that
    size: one result, with the most severe rank status (as the launcher reports it: 75 and 2 before 1) and
    every rank's output."""
    from tests.support.distributed import run_on_ranks

    results = run_on_ranks(_run_cli_rank, world_size, (args,), timeout_s=timeout_s)
    codes = {result.returncode for result in results}
    status = next((code for code in (2, 75, 1) if code in codes), max(codes))
    return CliResult(status, "".join(result.stdout for result in results),
                     "".join(result.stderr for result in results))


@contextlib.contextmanager
def job_executor(out: str, store=None, **flags):
    """(world, JobExecutor) for this process's world (one process, or the gloo group already started), laid
    out and run as `gen run` with these flags (by click's names: dp, cfg, ring, ulysses, fsdp, dtype, attention,
    compile, ...; `checkpoints` a CheckpointPolicy), writing to `out`; signal handlers restored after."""
    from genbatch.io import BackgroundWriter, RunStore
    from genbatch.runner.options import RunOptions
    from genbatch.runner.startup import build_executor
    from genbatch.runner.world import start_world

    flags.setdefault("media_allow", ("/",))  # tests read images from wherever they wrote them
    options = RunOptions.from_flags("unused", out, flags)
    world = start_world(options)
    executor = build_executor(options, world, store or RunStore(out), BackgroundWriter(max_pending=1), run_id="test")
    try:
        yield world, executor
    finally:
        executor.stop.restore()
