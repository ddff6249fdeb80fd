"""`gen run` and `gen status`: argument handling only."""

from __future__ import annotations

import os
import sys
import traceback

import click

from genbatch.jobs import exit_codes
from genbatch.manifests.cli import (
    job_override_options,
    media_options,
    read_or_exit,
    storage_options_from,
)
from genbatch.parallel.flags import kernel_options, layout_options, quantization_options
from genbatch.parallel.tensor.encoders import MODES as TEXT_ENCODER_MODES
from genbatch.planner.memory import DECODE_CHOICES
from genbatch.runner.help_sections import RUN_SECTIONS, SectionedCommand


def _layout_options(command):
    """The layout flags (`genbatch.parallel.flags`, shared with `gen plan`), then `--layout`."""
    command = click.option("--layout", type=click.Choice(["manual", "auto"]), default="manual", show_default=True,
                           help="auto: use `gen plan`'s best layout for the GPUs given (ignores the degrees above).")(command)
    command = click.option("--profile", default=None,
                           help="With --layout auto: plan with this calibration profile (NAME or PATH, made by "
                           "`gen plan --calibrate`).")(command)
    return layout_options(constraints=False)(command)


@click.command("run", cls=SectionedCommand, sections=RUN_SECTIONS,
               short_help="Generate every row of MANIFEST into OUT (a rerun resumes).")
@click.argument("manifest")
@click.option("--out", required=True, help="Where outputs, timings and resume state go: a path or any fsspec URL (s3://...).")
@job_override_options
@_layout_options
@click.option("--nproc", type=click.IntRange(min=1), help="Start this many processes on this machine (torchrun) and run across them.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), help="Weights and activations (default: bf16 on GPUs, fp32 on CPUs).")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), help="torch.distributed backend (default: nccl with GPUs, else gloo).")
@click.option("--collective-timeout", type=click.FloatRange(min=1), default=600, show_default=True,
              help="Seconds a rank waits for a peer before the job fails, naming the missing rank.")
@click.option("--download/--no-download", default=None,
              help="Download hub models (org/name[@rev]) missing from the Hugging Face cache, one rank per node "
                   "[default: download unless HF_HUB_OFFLINE is set].")
@click.option("--share", metavar="K/N", help="Run only share K of N of the manifest (job arrays set this from Slurm).")
@click.option("--hand-out", type=click.Choice(["dynamic", "static"]), default="dynamic", show_default=True,
              help="dynamic: a free group takes the next job; static: a fixed strided split.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=10, show_default=True,
              help="Checkpoint a running job every N denoising steps (0: only when stopped by a signal).")
@click.option("--checkpoint-seconds", type=click.FloatRange(min=0), default=0, show_default=True,
              help="...but at most every T seconds per job (0: no limit); e.g. --checkpoint-every 1 "
                   "--checkpoint-seconds 300 checkpoints every five minutes.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=3, show_default=True,
              help="Try a failing job in at most N runs; one that has failed in N runs is left alone "
                   "(raise N to try it again).")
@click.option("--storage-timeout", type=click.FloatRange(min=0, min_open=True), default=120, show_default=True,
              metavar="SECONDS",
              help="How long one read or write of OUT may keep failing (every retry included) before the run stops "
                   "with its state kept (exit 75: rerun to continue); access denied or no such bucket exit 2 at once.")
@click.option("--vae-decode", type=click.Choice(DECODE_CHOICES), default="auto", show_default=True,
              help="parallel: patch-parallel over each job group (exact); full: the group's leader decodes alone "
                   "(exact); tiled: the leader with the VAE's own tiling (least memory; blended tiles, not the full "
                   "decode's output); auto: an exact mode that fits, tiled only when none does. The results row "
                   "records the mode each job used.")
@click.option("--vae-memory", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GIB",
              help="GiB a rank may fill, for auto's choice of decode mode [default: the device's memory].")
@click.option("--text-encoder-parallel", type=click.Choice(TEXT_ENCODER_MODES), default="auto", show_default=True,
              help="tp: split each text encoder over the job group (heads, MLP columns); fsdp: shard it with FSDP "
                   "(needs --fsdp); replicate: whole on every rank; auto: fsdp under --fsdp, else tp for encoders "
                   "at least 4096 wide (T5-XXL, UMT5-XXL), replicate for narrower ones.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=None, metavar="W",
              help="With --distrifusion or --pipefusion: the synchronous (exact) steps at the start of each job, "
                   "and again after a resume [default: 4 for DistriFusion, 1 for PipeFusion].")
@click.option("--patches", type=click.IntRange(min=1), default=None, metavar="M",
              help="With --pipefusion: the patches of the latent streamed through the stages [default: the "
                   "stages].")
@click.option("--batch-size", default="1", show_default=True, metavar="N|auto", callback=lambda c, p, v: _batch_size(v),
              help="Run up to N rows that agree on everything but prompt, negative prompt and seed in one forward "
                   "(each row's noise from its own seed, each output as that row alone would give it); auto: the "
                   "largest N up to 16 whose activations fit the planner's memory for the fullest rank.")
@click.option("--embedding-cache-gib", type=click.FloatRange(min=0), default=2.0, show_default=True, metavar="GIB",
              help="Keep each rank's prompt encodes up to this many GiB, so a prompt shared by many rows is encoded "
                   "once per job group (0: encode every row).")
@kernel_options
@quantization_options
@media_options
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for the manifest and output filesystems (repeatable).")
@click.option("--report", is_flag=True,
              help="When the run ends, write `gen report`'s HTML gallery of it to OUT/report/index.html.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
def run_command(manifest: str, out: str, nproc: int | None, **options) -> None:
    """Generate every valid row of MANIFEST into OUT; rerunning the same command resumes.

    \b
    Outputs:  OUT/outputs/<id>.png|.mp4, OUT/results/ (one row per job), OUT/timings/ (every stage
              and denoising step), OUT/rejected/ (invalid rows and why), OUT/run.json.
    Exit:     0 all valid rows done, 1 some jobs failed or every row was rejected, 2 usage or manifest
              file error (a missing --model, a size it cannot take, an --out that cannot be written), or storage
              that refuses for good (access denied, no such bucket), 75 stopped with state kept (SIGUSR1/SIGTERM,
              a job group failed, storage down past --storage-timeout): rerun to continue.
    Under torchrun or srun every process runs this same command; --nproc starts them here.
    """
    from genbatch.runner.streams import dropped_when_dead

    with dropped_when_dead():  # a launcher, terminal or log runner that is gone takes no message's exception along
        _run_or_launch(manifest, out, nproc, options)


def _run_or_launch(manifest: str, out: str, nproc: int | None, flags: dict) -> None:
    """`gen run`'s body: start `nproc` workers here, or run this process's rank; ends the process."""
    if nproc is not None and nproc > 1:
        from genbatch.runner.launch import launch_local

        sys.exit(launch_local(nproc, [arg for arg in _args_without_nproc(sys.argv[1:])]))
    from genbatch.runner.signals import StopRequest, launcher_pid

    # before the heavy imports: a signal during start-up still counts. Outside a job a signal ends the
    # process at once (75, SIGINT 130), and a rank ends with its launcher (runner/signals.py)
    stop = StopRequest().install().watch(parent_pid=launcher_pid())
    with stop.waiting("start-up"):
        from genbatch.parallel.quantize import quiet_torchao_import

        quiet_torchao_import()  # diffusers imports torchao whenever it is installed
        from genbatch.io import StorageError
        from genbatch.parallel.teardown import exit_process
        from genbatch.runner.options import RunOptions, UsageError
        from genbatch.runner.run import run

    try:
        status = run(RunOptions.from_flags(manifest, out, flags), stop)
    except UsageError as error:  # nothing could start: bad options (every rank knows; the first says it)
        if int(os.environ.get("RANK", "0")) == 0:
            click.echo(f"error: {error}", err=True)
        status = exit_codes.USAGE
    except StorageError as error:  # the store failed: for good (2), or past --storage-timeout (75, state kept)
        click.echo(f"error: {error}", err=True)
        if error.transient:
            click.echo("genbatch: the run stops here with its state kept (exit 75); rerun the same command once "
                       "the store answers again", err=True)
        status = exit_codes.for_storage_error(error)
    except Exception:  # noqa: BLE001 - a crash: its traceback and exit 1, as Python would, through exit_process
        traceback.print_exc()
        status = exit_codes.JOBS_FAILED
    except KeyboardInterrupt:  # SIGINT inside a job (outside one the watcher already ended the process)
        click.echo("genbatch: interrupted (SIGINT); rerun the same command to continue from the last checkpoint",
                   err=True)
        status = exit_codes.INTERRUPTED
    stop.unwatch()  # from here a signal only sets the flag: it cannot replace the status chosen
    # The handlers stay until the process exits: a late SIGTERM (torchrun tearing down the other workers, a
    # requeue) must not turn this status into a death by signal; nor may torch's worker threads on the way out.
    exit_process(status)


def _batch_size(text: str) -> int | str:
    """`--batch-size`'s value (`genbatch.jobs.batches.parse_size`), a bad one as click's usage error."""
    from genbatch.jobs.batches import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def _args_without_nproc(argv: list[str]) -> list[str]:
    """The command line minus `--nproc N` / `--nproc=N`, for the processes the launcher starts."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


@click.command("status", short_help="Done / failed / rejected / pending counts of a run, and its ETA.")
@click.argument("out")
@click.option("--manifest", help="Count pending jobs against this manifest (default: the one in OUT/run.json).")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE")
@click.option("--storage-timeout", type=click.FloatRange(min=0, min_open=True), default=120, show_default=True,
              metavar="SECONDS", help="How long one read of OUT may keep failing before the command gives up (exit 75).")
@click.option("--json", "as_json", is_flag=True, help="Print the counts (with --failed: the failed jobs) as JSON.")
@click.option("--failed", "list_failed", is_flag=True, help="List the failed jobs instead, one line each: id, "
              "manifest row, run attempts and the reason (the error's first line).")
@click.option("--watch", is_flag=True, help="Print the line again every --interval seconds until nothing is pending "
              "(Ctrl-C stops it).")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              metavar="SECONDS", help="With --watch: seconds between refreshes.")
def status_command(out: str, manifest: str | None, storage_option: tuple[str, ...], storage_timeout: float,
                   as_json: bool, list_failed: bool, watch: bool, interval: float) -> None:
    """Done / failed / rejected / pending counts of the run in OUT, its jobs per hour and the ETA of what is
    pending (from the timings; the time between a run and its rerun does not count). With --failed: each failed
    job and why."""
    import time

    from genbatch.runner.status import failed_jobs, format_failed, format_status, run_status

    options = storage_options_from(storage_option)
    if list_failed:
        jobs = read_or_exit(lambda: failed_jobs(out, storage_options=options, storage_timeout=storage_timeout))
        if as_json:
            import json

            click.echo(json.dumps(jobs))
        else:
            click.echo(format_failed(jobs))
        return
    while True:
        counts = read_or_exit(lambda: run_status(out, manifest=manifest, storage_options=options,
                                                  storage_timeout=storage_timeout))
        if as_json:
            import json

            click.echo(json.dumps(counts))
        else:
            click.echo(format_status(counts))
        if not watch or not counts.get("pending"):
            return
        time.sleep(interval)
