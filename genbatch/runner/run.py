"""`gen run`: the process entry point, from options to an exit status.

    world    = torchrun/srun environment (or one process)       -> ParallelContext (one DeviceMesh)
    context  = start_run(...)                                     the manifest read on rank 0, the pending jobs of
                                                                  the share on every rank, the executor (startup.py)
    for batch in HandOut(context.share.batches):  JobExecutor.run_batch(batch)   -> outputs, markers, timings
    rank 0   = results table, run.json, summary                  -> exit status
"""

from __future__ import annotations

import json
import sys
import time

from genbatch.io.retry import StorageError
from genbatch.jobs import exit_codes
from genbatch.jobs.counts import counted
from genbatch.runner.download import DownloadStopped, prepare_models
from genbatch.runner.errors import describe_error, is_collective_error
from genbatch.runner.execute import JobInterrupted
from genbatch.runner.failures import GroupFailure, record_failure, record_row_failures
from genbatch.runner.handout import HandOut, coordination_store
from genbatch.runner.options import RunOptions
from genbatch.runner.progress import RunProgress
from genbatch.runner.signals import StopRequest
from genbatch.runner.startup import RunContext, run_info, start_run
from genbatch.runner.world import start_world


def run(options: RunOptions, stop: StopRequest | None = None) -> int:
    """Run the manifest; returns the process exit status (see `exit_codes`). `stop`: a StopRequest the caller
    installed early (signals during start-up then count); one is installed here otherwise. A run that cannot
    start raises UsageError (exit 2)."""
    from genbatch.io import RetryPolicy, RunStore, new_attempt_id

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
        store = RunStore(options.out, storage_options=dict(options.storage.options), rank=world.ctx.rank,
                         attempt=run_id, retry=RetryPolicy(timeout_s=options.storage.timeout))
        return _run(start_run(options, world, store, run_id, stop), stop)
    finally:
        if world is not None:
            world.close()
        if owned:
            stop.restore()


def _summary(store) -> dict:
    """Jobs by status in the consolidated results table."""
    statuses = store.read_results().column("status").to_pylist()
    return {status: statuses.count(status) for status in ("done", "failed", "rejected")}


def _write_report(options: RunOptions) -> None:
    """`gen run --report`: the run's gallery in OUT/report/. A report that cannot be written is said, and the
    run's exit status stays what the jobs made it (`gen report OUT` writes it again)."""
    from genbatch.report import ReportOptions, write_report

    try:
        result = write_report(ReportOptions(out=options.out, storage_options=dict(options.storage.options),
                                            storage_timeout=options.storage.timeout))
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


def _weights_by_rank(store, key: str, world_size: int) -> list[dict]:
    """run.json's `weights`: each rank's bytes of each model's transformer and text-encoder weights as it loaded
    them (`genbatch.runner.loading.loaded_weights`), one entry per rank and model, read from the coordination
    store where every rank put its own before the end barrier."""
    entries = []
    for rank in range(world_size):
        for model, weights in json.loads(store.get(f"{key}/{rank}")).items():
            entries.append({"rank": rank, "model": model, **weights})
    return entries


def _run(context: RunContext, stop: StopRequest) -> int:
    """The run loop on this rank: batches from the hand-out until none is left, a stop is agreed or the group
    cannot go on; then rank 0's results, run.json and summary."""
    options, world, store, run_id = context.options, context.world, context.store, context.run_id
    ctx, share, executor, writer = world.ctx, context.share, context.executor, context.writer
    compile_cache, started = context.compile_cache, context.started
    progress = RunProgress(total=share.selected, already_done=share.selected - len(share.jobs),
                           given_up=len(share.given_up), enabled=ctx.rank == 0 and not options.quiet)
    interrupted = False
    coordination = coordination_store(ctx)
    try:
        for batch in HandOut(jobs=share.batches, ctx=ctx, store=coordination, key=f"genbatch/{run_id}/next",
                             dynamic=options.resume.dynamic_hand_out, stop=stop):
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
                  f"again in at most {counted(options.resume.max_attempts, 'run')} in all", file=sys.stderr)
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
    weights_key = f"genbatch/{run_id}/weights"
    coordination.set(f"{weights_key}/{ctx.rank}", json.dumps(context.pipelines.weights))  # before the count
    with stop.waiting("the wait for the other ranks"):
        world.wait_for_all_ranks(run_id, coordination)
    if ctx.rank != 0:
        return exit_codes.OK
    # nothing committed when nothing was pending: the listing of the done markers start-up made still holds
    store.write_results(context.manifest.extra_columns, done_ids=None if len(share.jobs) else share.done_ids)
    summary = _summary(store)
    info = run_info(options, world, run_id, started)
    info["ended"] = time.time()
    info["summary"] = summary
    info["weights"] = _weights_by_rank(coordination, weights_key, world.world_size)
    store.write_run_info(info)
    if not options.quiet:
        progress.print_summary(summary, wall_seconds=time.time() - started, out=store.url)
    if options.report:
        _write_report(options)
    if context.manifest.rejected and not len(context.manifest.jobs):  # nothing was valid: nothing is or was done
        print(f"genbatch: every row of {options.manifest} was rejected, nothing was run (exit "
              f"{exit_codes.JOBS_FAILED}); fix the causes above and rerun", file=sys.stderr)
        return exit_codes.JOBS_FAILED
    # a row failed or rejected is work not done: 1, as for a failed job (never 75: a rerun would not fix it)
    return exit_codes.JOBS_FAILED if summary.get("failed", 0) or summary.get("rejected", 0) else exit_codes.OK
