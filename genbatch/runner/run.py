"""`gen run`: the process entry point, from options to an exit status.

    world    = torchrun/srun environment (or one process)       -> ParallelContext (one DeviceMesh)
    jobs     = manifest rows, validated column-wise (rank 0 reads them into one Arrow table)
    pending  = jobs without a done marker, failed in < --max-attempts runs, in hand-out order (of one share);
               every rank receives them as one Arrow buffer, and builds a JobSpec only for a job it takes
    for job in HandOut(pending):  JobExecutor.run(job)         -> outputs, markers, timings
    rank 0   = results table, run.json, summary                  -> exit status
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field

import torch

from genbatch.io.retry import StorageError
from genbatch.models import resolve_model
from genbatch.jobs.batches import Batches, batch_positions, kept_starts
from genbatch.runner.auto_batch import auto_batch_size
from genbatch.jobs.schedule import OrderKeys, hand_out_positions, share_positions
from genbatch.jobs.spec import JobOverrides
from genbatch.parallel.dims import LayoutRequest
from genbatch.jobs import exit_codes
from genbatch.runner.download import DownloadStopped, prepare_models
from genbatch.runner.execute import CheckpointPolicy, JobInterrupted
from genbatch.runner.errors import describe_error, is_collective_error
from genbatch.runner.failures import GroupFailure, record_failure, record_row_failures
from genbatch.runner.handout import HandOut, coordination_store
from genbatch.runner.progress import RunProgress
from genbatch.runner.world import World, start_world


@dataclass(kw_only=True, slots=True)
class RunOptions:
    manifest: str
    """The manifest's URL (any fsspec URL)."""
    out: str
    """Where the run writes (any fsspec URL)."""
    model: str | None = None
    """The run's model for rows without a `model` value: a preset name or a pipeline directory (None: every
    row must name its own, or the run stops with exit 2 naming --model)."""
    overrides: JobOverrides = field(default_factory=JobOverrides)
    """Run-level defaults for rows that leave a setting empty."""
    storage_options: dict = field(default_factory=dict)
    """fsspec options for the manifest and the output URLs (endpoint, credentials, ...)."""
    layout: LayoutRequest | str = field(default_factory=LayoutRequest)
    """The degrees asked for (`parallel/dims.LayoutRequest`), or "auto": `gen plan`'s best layout for these
    processes."""
    warmup_steps: int | None = None
    """Synchronous (exact) steps at the start of each job under --distrifusion or --pipefusion (None: the
    method's default: 4, 1)."""
    patches: int | None = None
    """PipeFusion's patches (None: as many as stages)."""
    profile: str | None = None
    """With layout "auto": the calibration profile (name or path) the planner prices layouts with."""
    dtype: str | None = None
    """fp32 / bf16 / fp16 (None: bf16 on GPUs, fp32 on the CPU)."""
    backend: str | None = None
    """torch.distributed backend (None: nccl with GPUs, gloo otherwise)."""
    collective_timeout: float = 600.0
    """Seconds a collective may wait for a peer before the job fails, naming the missing rank."""
    download: bool | None = None
    """Download hub models missing from the Hugging Face cache (one rank per node); None: unless HF_HUB_OFFLINE."""
    share: tuple[int, int] | None = None
    """Run only this (index, count) share of the manifest (job arrays)."""
    max_attempts: int = 3
    """Run attempts a failing job is tried in; one that has failed in this many is not tried again."""
    storage_timeout: float = 120.0
    """Seconds one storage operation may keep failing, every retry included, before the run stops with its state
    kept (exit 75); permanent errors (access denied, no such bucket) stop it at once (exit 2)."""
    media_allow: tuple[str, ...] = ()
    """URL prefixes rows' media may be read from besides the manifest's own directory and the hub cache
    (`--media-allow`; `genbatch.io.media_policy`)."""
    media_max_mib: float = 64.0
    """The most MiB one row's input image may have (`--media-max-mib`)."""
    media_refuse: tuple[str, ...] = ()
    """Networks never read over http(s), besides link-local and metadata addresses (`--media-refuse`)."""
    dynamic_hand_out: bool = True
    """Hand jobs to whichever group is free (False: a static strided split)."""
    batch_size: int | str = 1
    """Rows run in one forward (`genbatch.jobs.batches`), or `auto` (`genbatch.runner.auto_batch`)."""
    embedding_cache_gib: float = 2.0
    """GiB of prompt encodes each rank keeps (`genbatch.runner.embeddings`; 0: none)."""
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    vae_decode: str = "auto"
    """How each job's VAE decodes (`genbatch.runner.decode`): auto, full, tiled or parallel."""
    vae_memory_gib: float | None = None
    """GiB a rank may fill, for `auto`'s choice of decode mode (None: the device's memory)."""
    compile: bool = False
    """torch.compile each repeated transformer block's forward (`genbatch.parallel.compile`)."""
    compile_backend: str = "inductor"
    """The torch.compile backend for `compile` (`genbatch.parallel.flags.COMPILE_BACKENDS`)."""
    attention: str = "auto"
    """The attention kernel (`genbatch.parallel.flags.ATTENTION_KERNELS`), checked at start-up."""
    text_encoder_parallel: str = "auto"
    """How the text encoders run over a job group (`genbatch.parallel.tensor.encoders.MODES`)."""
    compile_cache: str | None = None
    """Where compiled artifacts are kept across runs (any fsspec URL; None: OUT/compile-cache)."""
    max_pending_writes: int = 4
    """Finished jobs whose uploads may be in flight while the next job runs."""
    report: bool = False
    """Write `gen report`'s gallery to OUT/report/ when the run ends (rank 0, after the results table)."""
    quiet: bool = False

    def media_policy(self):
        """What this run's rows may read (`genbatch.io.media_policy.MediaPolicy`)."""
        from genbatch.io.media_policy import MediaPolicy

        return MediaPolicy.for_manifest(self.manifest, allow=self.media_allow, max_mib=self.media_max_mib,
                                        refuse=self.media_refuse)

    def compile_cache_for(self, world: World):
        """The run's `CompileCache` for this layout (None without `compile`)."""
        if not self.compile:
            return None
        from genbatch.runner.compile_cache import CompileCache, artifact_name

        name = artifact_name(layout=world.ctx.dims.name, dtype=world.dtype, device=world.ctx.device,
                             backend=self.compile_backend)
        return CompileCache(url=self.compile_cache or f"{self.out.rstrip('/')}/compile-cache", name=name,
                            storage_options=self.storage_options)

    def compile_config(self):
        """The `CompileConfig` step 4 of the parallelisation order applies (None: no compile)."""
        if not self.compile:
            return None
        from genbatch.jobs.cache import TAYLORSEER, parse_cache
        from genbatch.parallel.compile import CompileConfig

        taylorseer = parse_cache(self.overrides.cache).kind == TAYLORSEER  # its hooks sit inside the blocks
        return CompileConfig(backend=self.compile_backend, breaks=taylorseer)

    def parallelize_config(self):
        """The `ParallelizeConfig` the parallelisation order applies (`genbatch.parallel.config`)."""
        from genbatch.parallel.config import ParallelizeConfig

        return ParallelizeConfig(compile=self.compile_config(), attention=self.attention,
                                 text_encoders=self.text_encoder_parallel, cache=self.overrides.cache)

    def row_defaults(self) -> JobOverrides:
        """The defaults for rows that leave a setting empty: the run-level overrides, with `model` as the model
        of rows that name none (what the run-level checks and the manifest's validation both apply)."""
        if self.overrides.model is not None:
            return self.overrides
        from dataclasses import replace

        return replace(self.overrides, model=self.model)


def _layout_flags(layout: LayoutRequest | str) -> dict:
    """The layout flags as run.json records them: every axis and fsdp, or `layout: auto`."""
    return {"layout": "auto"} if isinstance(layout, str) else layout.flags()


def _run_info(options: RunOptions, world: World, run_id: str, started: float) -> dict:
    import diffusers
    import transformers

    from genbatch import __version__

    return {
        "run_id": run_id,
        "manifest": options.manifest,
        "out": options.out,
        "model": options.model,
        "layout": world.ctx.dims.name,  # the one layout grammar (`ParallelDims.parse` reads it back)
        "mesh": world.ctx.dims.describe(),
        "world_size": world.world_size,
        "device": str(world.ctx.device),
        "dtype": str(world.dtype).removeprefix("torch."),
        "options": {**_layout_flags(options.layout),
                    **{k: getattr(options, k) for k in ("warmup_steps", "patches", "share", "vae_decode",
                                                        "vae_memory_gib", "compile", "compile_backend", "attention",
                                                        "compile_cache", "text_encoder_parallel", "media_allow",
                                                        "media_max_mib", "media_refuse", "batch_size",
                                                        "embedding_cache_gib")}},
        "overrides": options.overrides.record(),
        "versions": {"genbatch": __version__, "torch": torch.__version__, "diffusers": diffusers.__version__,
                     "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "host": socket.gethostname(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "started": started,
        "ended": None,
    }


def _summary(store) -> dict:
    """Jobs by status in the consolidated results table."""
    statuses = store.read_results().column("status").to_pylist()
    return {status: statuses.count(status) for status in ("done", "failed", "rejected")}


def run(options: RunOptions, stop=None) -> int:
    """Run the manifest; returns the process exit status (see `exit_codes`). `stop`: a StopRequest the caller
    installed early (signals during start-up then count); one is installed here otherwise."""
    from genbatch.io import BackgroundWriter, RetryPolicy, RunStore, new_attempt_id

    from genbatch.runner.signals import StopRequest

    owned = stop is None
    stop = StopRequest().install() if owned else stop
    world = None
    try:
        world = start_world(options, stop)
        run_id = world.shared_value(new_attempt_id)
        try:
            prepare_models(options, world.ctx, run_id, stop)  # hub models into each node's cache, before validation
        except DownloadStopped:
            return exit_codes.REQUEUE
        store = RunStore(options.out, storage_options=options.storage_options, rank=world.ctx.rank, attempt=run_id,
                         retry=RetryPolicy(timeout_s=options.storage_timeout))
        return _run(options, world, store, run_id, BackgroundWriter, stop)
    finally:
        if world is not None:
            world.close()
        if owned:
            stop.restore()


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
    more = f" ({len(causes) - shown} more cause(s) not shown)" if len(causes) > shown else ""
    print(f"genbatch: {rows} rejected row(s){more}, each with its reason, in {out}/rejected/; "
          "`gen validate MANIFEST` lists them all", file=sys.stderr)


def _preflight(options: RunOptions, store) -> str | None:
    """Rank 0's run-level checks before any row is validated (see `genbatch.manifests.preflight`): the message
    that stops the run with exit 2, or None. A store that does not answer raises its StorageError (on every
    rank, through `World.shared_value`): exit 75, retry later."""
    from genbatch.manifests import ManifestFileError, ManifestReader
    from genbatch.manifests.preflight import RunOptionError, check_options, check_rows_have_model, probe_output

    overrides = options.row_defaults()
    try:
        check_options(overrides)
        probe_output(store)
        if overrides.model is None:  # then every row must name its model (the manifest's own reading follows)
            with ManifestReader(options.manifest, storage_options=options.storage_options) as reader:
                check_rows_have_model(reader, overrides)
    except (RunOptionError, ManifestFileError) as error:
        return f"genbatch: {error}"
    return None


def _pending(jobs, share, store, max_attempts: int, listing: dict | None = None, batch_size: int = 1):
    """The jobs to run (a JobTable), in hand-out order, of one `share` (None: all): not done, and failed in
    fewer than `max_attempts` run attempts; with (the jobs in the share, {job id: failed runs} of those left
    out for having failed too often, where each batch of `batch_size` starts in the jobs, None for batches of
    one). One listing of the done markers, whatever the number of jobs (kept in
    `listing["done"]`, for the results when nothing runs)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = OrderKeys(jobs, resolve_model)
    selected = np.arange(len(jobs), dtype=np.int64) if share is None else share_positions(keys, *share)
    done = store.done_ids()
    if listing is not None:
        listing["done"] = done
    failed_runs = {job_id: runs for job_id, runs in store.failed_runs().items() if job_id not in done}
    ids = jobs.column("id")
    tried = pa.array([job_id for job_id, runs in failed_runs.items() if runs >= max_attempts], pa.string())
    selected_ids = ids if share is None else ids.take(selected)
    given_up = {job_id: failed_runs[job_id] for job_id in selected_ids.filter(pc.is_in(selected_ids, tried)).to_pylist()}
    left_out = pc.is_in(ids, value_set=pa.array([*done, *given_up], pa.string())).to_numpy(zero_copy_only=False)
    order = hand_out_positions(keys, selected)
    if batch_size == 1:
        return jobs.take(order[~left_out[order]]), (len(selected), given_up, None)
    # batches over the whole share, done jobs left out after: a rerun runs the batches the first attempt formed
    in_batches, starts = batch_positions(jobs.take(order), batch_size)
    positions = order[in_batches]
    keep = ~left_out[positions]
    return jobs.take(positions[keep]), (len(selected), given_up, kept_starts(starts, keep))


def _print_given_up(given_up: dict[str, int], max_attempts: int, out: str, shown: int = 5) -> None:
    names = ", ".join(f"{job_id} ({runs} runs)" for job_id, runs in list(given_up.items())[:shown])
    more = f" and {len(given_up) - shown} more" if len(given_up) > shown else ""
    print(f"genbatch: not trying again {len(given_up)} job(s) that failed in {max_attempts} or more runs: "
          f"{names}{more}; their errors are in {out}/failed/. Fix the cause and rerun with a higher "
          f"--max-attempts to try them again", file=sys.stderr)


def _start_up(options: RunOptions, world: World, store, rejected, run_id: str, started: float) -> None:
    """Rank 0's first writes (a StorageError here is raised on every rank: World.shared_value)."""
    store.recover()  # open uploads, temp files of killed writers, checkpoints of done jobs
    store.write_rejected([_rejection_record(rejection) for rejection in rejected])
    if rejected and not options.quiet:
        _print_rejections(rejected, store.url)
    store.write_run_info(_run_info(options, world, run_id, started))


def _write_report(options: RunOptions) -> None:
    """`gen run --report`: the run's gallery in OUT/report/. A report that cannot be written is said, and the
    run's exit status stays what the jobs made it (`gen report OUT` writes it again)."""
    from genbatch.report import ReportOptions, write_report

    try:
        result = write_report(ReportOptions(out=options.out, storage_options=options.storage_options,
                                            storage_timeout=options.storage_timeout))
    except (OSError, ValueError, StorageError) as error:
        print(f"genbatch: the report could not be written ({type(error).__name__}: {error}); the run itself is "
              f"unaffected: `gen report {options.out}` tries again", file=sys.stderr)
        return
    if not options.quiet:
        print(f"genbatch: report -> {result.url}", file=sys.stderr)


def _save_compiled(cache) -> None:
    """Keep the run's compiled artifacts; a failure to write them costs the next run a compile, not this run."""
    try:
        cache.save()
    except Exception as error:  # noqa: BLE001 - an optional cache: said, never fatal
        print(f"genbatch: the compiled artifacts were not kept at {cache.url} ({error}); the next run compiles "
              "again", file=sys.stderr)


def _run(options: RunOptions, world: World, store, run_id: str, writer_cls, stop) -> int:
    ctx = world.ctx
    started = time.time()
    problem = world.shared_value(lambda: _preflight(options, store))  # a problem of the run, not of a row
    if problem is not None:
        if ctx.rank == 0:
            print(problem, file=sys.stderr)
        return exit_codes.USAGE
    with stop.waiting("the manifest broadcast"):
        manifest = world.load_manifest(options)
    if isinstance(manifest, int):
        return manifest  # a usage error, already reported by rank 0
    jobs, rejected, extra_columns = manifest
    world.shared_value(lambda: _start_up(options, world, store, rejected, run_id, started))  # on rank 0
    listing = {}  # rank 0's listing of the done markers
    batch_size = options.batch_size if options.batch_size != "auto" else \
        world.shared_value(lambda: auto_batch_size(options, world, jobs))  # auto: rank 0's, on every rank
    with stop.waiting("the broadcast of the pending jobs"):
        pending, (selected, given_up, starts) = world.shared_jobs(
            lambda: _pending(jobs, options.share, store, options.max_attempts, listing, batch_size))
    if given_up and ctx.rank == 0 and not options.quiet:
        _print_given_up(given_up, options.max_attempts, store.url)

    writer = writer_cls(max_pending=options.max_pending_writes, skip_after_error=True)  # a failed upload stops the run
    stop.on_exit(writer.flush)  # a signal that ends a waiting rank keeps the finished jobs' uploads
    stop.on_exit(store.flush_timings)
    executor = world.executor(options, store, writer, run_id, stop)
    compile_cache = options.compile_cache_for(world)
    if compile_cache is not None:
        compile_cache.load()  # before the first job compiles
    progress = RunProgress(total=selected, already_done=selected - len(pending), given_up=len(given_up),
                           enabled=ctx.rank == 0 and not options.quiet)
    interrupted = False
    coordination = coordination_store(ctx)
    try:
        batches = Batches.single(pending) if starts is None else Batches(jobs=pending, starts=starts)
        for batch in HandOut(jobs=batches, ctx=ctx, store=coordination, key=f"genbatch/{run_id}/next",
                             dynamic=options.dynamic_hand_out, stop=stop):
            with stop.waiting("the stop check between jobs"):
                if executor.stop.agreed(ctx.group, ctx.device):  # a collective: every rank of the group asks
                    interrupted = True
                    break
            try:
                result = executor.run_batch(batch)
                store.append_timings(result.timings)
                record_row_failures(ctx, store, result.failures, run_id)  # bad rows fail alone: the group goes on
            except JobInterrupted:
                interrupted = True
                break
            except (GroupFailure, StorageError):  # the store failed, not the job: no failure is recorded
                raise
            except Exception as error:  # noqa: BLE001 - a failed batch is recorded and the run goes on
                record_failure(ctx, store, batch, error, run_id)
            progress.job_finished(coordination, run_id, ctx, len(batch))
            if writer.failure is not None:  # an upload failed past --storage-timeout (or for good): stop here,
                writer.flush()              # between jobs (flush raises it; group peers stop at the hand-out)
    except GroupFailure as failure:
        # The group's collectives cannot be trusted after this: the process ends, as "stopped, rerun to
        # continue" (a Slurm job requeues). The job is tried again in a later run, in at most --max-attempts.
        failure.record(store, run_id)
        if ctx.is_leader:  # an error, so said under --quiet too
            print(f"genbatch: {failure.message.splitlines()[0]}\ngenbatch: this group cannot go on, so the run "
                  f"stops here (exit {exit_codes.REQUEUE}); rerun the same command to continue: the job is tried "
                  f"again in at most {options.max_attempts} runs in all", file=sys.stderr)
        return exit_codes.REQUEUE
    except StorageError:
        raise  # cli.py turns it into exit 75 (transient: state kept) or 2 (permanent)
    except Exception as error:
        if not (ctx.distributed and is_collective_error(error)):
            raise
        # Between jobs (the hand-out, the stop check): a peer died or hung, and no job was half-done here.
        print(f"genbatch: rank {ctx.rank} lost a peer between jobs ({describe_error(error)}); the run stops here "
              f"(exit {exit_codes.REQUEUE}): rerun the same command to continue", file=sys.stderr)
        return exit_codes.REQUEUE
    finally:
        # Uploads and timings are flushed while SIGTERM/SIGUSR1 still only set the stop flag (the handlers
        # stay until `run` returns): a second signal (torchrun's agent, a requeue) cannot kill a flush.
        progress.close()
        writer.flush()
        store.flush_timings()
        if compile_cache is not None and ctx.rank == 0:
            _save_compiled(compile_cache)  # a requeued or later run compiles from these artifacts
    if interrupted:
        if ctx.rank == 0 and not options.quiet:
            print("genbatch: stopped by signal; state checkpointed. Rerun the same command to continue "
                  f"(exit {exit_codes.REQUEUE}).", file=sys.stderr)
        return exit_codes.REQUEUE
    with stop.waiting("the wait for the other ranks"):
        world.wait_for_all_ranks(run_id, coordination)
    if ctx.rank != 0:
        return exit_codes.OK
    store.write_results(extra_columns, done_ids=None if len(pending) else listing.get("done"))  # none committed
    summary = _summary(store)
    info = _run_info(options, world, run_id, started)
    info["ended"] = time.time()
    info["summary"] = summary
    store.write_run_info(info)
    if not options.quiet:
        progress.print_summary(summary, wall_seconds=time.time() - started, out=store.url)
    if options.report:
        _write_report(options)
    if rejected and not jobs:  # nothing was valid, so nothing is or was done: not a success
        print(f"genbatch: every row of {options.manifest} was rejected, nothing was run (exit "
              f"{exit_codes.JOBS_FAILED}); fix the causes above and rerun", file=sys.stderr)
        return exit_codes.JOBS_FAILED
    # a row failed or rejected is work not done: 1, as for a failed job (never 75: a rerun would not fix it)
    return exit_codes.JOBS_FAILED if summary.get("failed", 0) or summary.get("rejected", 0) else exit_codes.OK
