"""A run's start-up, typed: from options and a joined world to everything the run loop needs (`RunContext`).

    context = start_run(options, world, store, run_id, stop)      UsageError: nothing runs (exit 2)
    context.share.batches, context.executor, context.writer, ...

In order, on every rank: rank 0's run-level checks (`genbatch.manifests.preflight`), the manifest read and
checked on rank 0 (`genbatch.runner.share.read_manifest`), rank 0's first writes (the rejected rows, run.json),
the batch size (`--batch-size auto`: rank 0's), the pending jobs of this run's share on every rank, the writer
that uploads finished jobs, the rank's executor and its pipelines, and the compiled artifacts of an earlier run.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from genbatch.io import BackgroundWriter, RunStore
from genbatch.jobs.counts import counted
from genbatch.runner.execute import JobExecutor
from genbatch.runner.loading import PipelineCache, load_for_group
from genbatch.runner.options import RunOptions, UsageError
from genbatch.runner.share import ManifestRows, PendingShare, pending_share, read_manifest
from genbatch.runner.signals import StopRequest
from genbatch.runner.world import World

if TYPE_CHECKING:
    from genbatch.runner.compile_cache import CompileCache


@dataclass(kw_only=True, slots=True)
class RunContext:
    """Everything a rank's run loop works with, once start-up is through."""

    options: RunOptions
    world: World
    store: RunStore
    run_id: str
    """The run attempt's id (rank 0's, on every rank)."""
    started: float
    """When the run started (seconds since the epoch)."""
    manifest: ManifestRows
    """The manifest's jobs and rejected rows (rank 0's; empty on the other ranks)."""
    share: PendingShare
    """The pending jobs of this run's share, in batches, on every rank."""
    writer: BackgroundWriter
    """Uploads finished jobs while the next runs."""
    executor: JobExecutor
    """This rank's executor (its pipelines, its preparation, its decode)."""
    pipelines: PipelineCache
    """This rank's pipelines, loaded on first use and parallelised for its job group."""
    compile_cache: CompileCache | None = None
    """The run's compiled artifacts (None without --compile)."""


def build_executor(options: RunOptions, world: World, store: RunStore, writer: BackgroundWriter, run_id: str,
                   stop: StopRequest | None = None) -> JobExecutor:
    """This rank's executor; `stop` is the run's installed StopRequest (a new one if None)."""
    from genbatch.io.media_input import MediaReader
    from genbatch.io.retry import RetryPolicy
    from genbatch.parallel.cfg import branch_exchange
    from genbatch.parallel.job_hooks import RunFeatures
    from genbatch.runner.adapters import Adapters
    from genbatch.runner.decode import Decoder
    from genbatch.runner.embeddings import EmbeddingCache

    policy = options.media_policy()  # what rows' images and adapters may read
    storage = dict(options.storage.options)
    memory = options.layout.vae_memory_gib
    return JobExecutor(
        ctx=world.ctx,
        pipelines=PipelineCache(load=functools.partial(load_for_group, ctx=world.ctx, dtype=world.dtype,
                                                       config=world.parallelize)),
        store=store,
        writer=writer,
        exchange=branch_exchange(world.ctx),
        decoder=Decoder(ctx=world.ctx, mode=options.layout.vae_decode,
                        memory_bytes=None if memory is None else int(memory * 2**30)),
        stop=stop if stop is not None else StopRequest().install(),
        checkpoints=options.resume.checkpoints,
        run_id=run_id,
        features=RunFeatures(stale=world.stale),
        media=MediaReader(storage_options=storage, retry=RetryPolicy(timeout_s=options.storage.timeout), policy=policy),
        adapters=Adapters(policy=policy, storage_options=storage, timeout_s=options.storage.timeout),
        embeddings=EmbeddingCache(max_bytes=int(options.features.embedding_cache_gib * 2**30)),
        quantization=options.model.quantization.label,
    )


def run_info(options: RunOptions, world: World, run_id: str, started: float) -> dict:
    """run.json: the run, its layout, options, versions and machine."""
    import diffusers
    import transformers

    from genbatch import __version__

    return {
        "run_id": run_id,
        "manifest": options.manifest,
        "out": options.out,
        "model": options.model.model,
        "layout": world.ctx.dims.name,  # the one layout grammar (`ParallelDims.parse` reads it back)
        "mesh": world.ctx.dims.describe(),
        "world_size": world.world_size,
        "device": str(world.ctx.device),
        "dtype": str(world.dtype).removeprefix("torch."),
        "quantization": options.model.quantization.label,
        "options": options.recorded(),
        "overrides": options.model.overrides.record(),
        "versions": {"genbatch": __version__, "torch": torch.__version__, "diffusers": diffusers.__version__,
                     "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "host": socket.gethostname(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "started": started,
        "ended": None,
    }


def _rejection_record(rejection) -> dict:
    return {**rejection.extra, "id": rejection.job_id, "row": rejection.row, "model": rejection.model,
            "column": rejection.column, "reason": rejection.full_reason}


def _print_rejections(rejected, out: str, shown: int = 5) -> None:
    """Say at once which rows will not run and why: each cause once (with its row count and first rows), the
    first few causes, and where the full list is."""
    from genbatch.manifests.causes import group_causes

    causes = group_causes(rejected)
    for cause in causes[:shown]:
        print(f"genbatch: rejected {cause.message()}", file=sys.stderr)
    rows = len({rejection.row for rejection in rejected})
    more = f" ({counted(len(causes) - shown, 'more cause')} not shown)" if len(causes) > shown else ""
    print(f"genbatch: {counted(rows, 'rejected row')}{more}, each with its reason, in {out}/rejected/; "
          "`gen validate MANIFEST` lists them all", file=sys.stderr)


def _preflight(options: RunOptions, store: RunStore) -> str | None:
    """Rank 0's run-level checks before any row is validated (see `genbatch.manifests.preflight`): the message
    that stops the run with exit 2, or None. A store that does not answer raises its StorageError (on every
    rank, through `World.shared_value`): exit 75, retry later."""
    from genbatch.manifests import ManifestFileError, ManifestReader
    from genbatch.manifests.preflight import RunOptionError, check_options, check_rows_have_model, probe_output

    overrides = options.model.row_defaults()
    try:
        check_options(overrides)
        probe_output(store)
        if overrides.model is None:  # then every row must name its model (the manifest's own reading follows)
            with ManifestReader(options.manifest, storage_options=dict(options.storage.options)) as reader:
                check_rows_have_model(reader, overrides)
    except (RunOptionError, ManifestFileError) as error:
        return str(error)
    return None


def _first_writes(options: RunOptions, world: World, store: RunStore, manifest: ManifestRows, run_id: str,
                  started: float) -> None:
    """Rank 0's first writes (a StorageError here is raised on every rank: World.shared_value)."""
    store.recover()  # open uploads, temp files of killed writers, checkpoints of done jobs
    store.write_rejected([_rejection_record(rejection) for rejection in manifest.rejected])
    if manifest.rejected and not options.quiet:
        _print_rejections(manifest.rejected, store.url)
    store.write_run_info(run_info(options, world, run_id, started))


def _print_given_up(given_up: dict[str, int], max_attempts: int, out: str, shown: int = 5) -> None:
    names = ", ".join(f"{job_id} ({counted(runs, 'run')})" for job_id, runs in list(given_up.items())[:shown])
    more = f" and {len(given_up) - shown} more" if len(given_up) > shown else ""
    print(f"genbatch: not trying again {counted(len(given_up), 'job')} that failed in {max_attempts} or more runs: "
          f"{names}{more}; `gen status {out} --failed` says why. Fix the cause and rerun with a higher "
          f"--max-attempts to try them again", file=sys.stderr)


def start_run(options: RunOptions, world: World, store: RunStore, run_id: str, stop: StopRequest) -> RunContext:
    """Everything the run loop needs (see the module docstring); UsageError on every rank for a run that cannot
    start (its message said by rank 0)."""
    from genbatch.runner.auto_batch import auto_batch_size

    started = time.time()
    problem = world.shared_value(lambda: _preflight(options, store))  # a problem of the run, not of a row
    if problem is not None:
        raise UsageError(problem)
    with stop.waiting("the manifest broadcast"):
        manifest = read_manifest(options, world)
    world.shared_value(lambda: _first_writes(options, world, store, manifest, run_id, started))  # on rank 0
    batch_size = options.features.batch_size
    if batch_size == "auto":  # rank 0's, on every rank
        batch_size = world.shared_value(lambda: auto_batch_size(options, world, manifest.jobs))
    with stop.waiting("the broadcast of the pending jobs"):
        share = pending_share(options, world, store, manifest, batch_size)
    if share.given_up and world.ctx.rank == 0 and not options.quiet:
        _print_given_up(share.given_up, options.resume.max_attempts, store.url)
    writer = BackgroundWriter(max_pending=options.storage.max_pending_writes, skip_after_error=True)
    stop.on_exit(writer.flush)  # a signal that ends a waiting rank keeps the finished jobs' uploads
    stop.on_exit(store.flush_timings)
    executor = build_executor(options, world, store, writer, run_id, stop)
    compile_cache = options.compile_cache_for(world)
    if compile_cache is not None:
        compile_cache.load()  # before the first job compiles
    return RunContext(options=options, world=world, store=store, run_id=run_id, started=started, manifest=manifest,
                      share=share, writer=writer, executor=executor, pipelines=executor.pipelines,
                      compile_cache=compile_cache)
