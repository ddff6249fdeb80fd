"""`gen submit`: render the sbatch script for a run and submit it (or print it with --dry-run)."""

from __future__ import annotations

import os
import sys

import click

_CONTEXT = {"ignore_unknown_options": True, "allow_extra_args": True}


def _local_abspath(path: str) -> str:
    """Absolute for local paths (the job may start elsewhere); URLs (s3://...) as given."""
    return path if "://" in path else os.path.abspath(path)


def _check_run_args(manifest: str, out: str, run_args: list[str]) -> None:
    """Parse the options meant for `gen run` with gen run's own parser, so a typo fails now, not in the queue; and
    a `--quantization` beside a layout it does not run with (`parallel/axes.quantization_problems`)."""
    from genbatch.parallel.axes import quantization_problems
    from genbatch.runner.cli import run_command

    try:
        context = run_command.make_context("gen run", [manifest, "--out", out, *run_args],
                                           parent=click.get_current_context())
    except click.UsageError as error:
        raise click.UsageError(f"gen run would refuse these options: {error.format_message()}") from None
    params = context.params
    problems = quantization_problems({"tp": params.get("tp") or 1}, fsdp=bool(params.get("fsdp")),
                                     quantization=params.get("quantization") or "none")
    if problems:
        raise click.UsageError(f"gen run would refuse these options: {'; '.join(problems)}")


def _carry_profile(run_args: list[str]) -> list[str]:
    """`--profile NAME|PATH` for gen run, as the profile file's absolute path: the nodes read that file, not
    their own config directory (it must be on a file system they share, as the manifest is)."""
    from genbatch.planner.profile import load_profile, profile_path

    carried = list(run_args)
    for index, arg in enumerate(carried):
        if arg == "--profile" and index + 1 < len(carried):
            name, at, prefix = carried[index + 1], index + 1, ""
        elif arg.startswith("--profile="):
            name, at, prefix = arg.split("=", 1)[1], index, "--profile="
        else:
            continue
        try:
            load_profile(name)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        carried[at] = prefix + os.path.abspath(profile_path(name))
    return carried


@click.command("submit", context_settings=_CONTEXT,
               short_help="Render an sbatch script that runs gen run on Slurm, and submit it.")
@click.argument("manifest")
@click.option("--out", required=True, help="The run's output: a path or any fsspec URL (as for gen run).")
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes to allocate.")
@click.option("--gpus-per-node", type=click.IntRange(min=0), required=True,
              help="GPUs per node (one worker each); 0 for CPU runs with --backend gloo and --procs-per-node.")
@click.option("--procs-per-node", type=click.IntRange(min=1),
              help="Worker processes per node (default: --gpus-per-node).")
@click.option("--cpus-per-task", type=click.IntRange(min=1), help="CPUs for each node's workers.")
@click.option("--partition", help="Slurm partition (default: the cluster's).")
@click.option("--time", "time_limit", metavar="T", help="Time limit, e.g. 04:00:00 or 1-00:00:00.")
@click.option("--array", type=click.IntRange(min=1), metavar="K",
              help="Submit a job array of K tasks; each runs its share of the manifest into the same OUT.")
@click.option("--account", help="Account to charge.")
@click.option("--signal-grace", type=click.IntRange(min=0), default=120, show_default=True, metavar="S",
              help="Seconds before the time limit at which the run is told to checkpoint (SIGUSR1); 0: never.")
@click.option("--requeue/--no-requeue", default=True, show_default=True,
              help="Requeue the job when genbatch checkpointed and exited 75 (preemption, time limit).")
@click.option("--extra-sbatch", multiple=True, metavar="OPTION",
              help="Another sbatch option, e.g. --qos=low (repeatable).")
@click.option("--job-name", default="genbatch", show_default=True, help="Slurm job name.")
@click.option("--log-dir", default="slurm-logs", show_default=True, help="Directory for the job's stdout/stderr.")
@click.option("--setup", multiple=True, metavar="LINE",
              help="Shell line run before the launch, e.g. 'module load cuda' (repeatable).")
@click.option("--python", "python", default=sys.executable, show_default=True,
              help="Python with genbatch installed, as the nodes see it.")
@click.option("--dry-run", is_flag=True, help="Print the script instead of submitting it.")
@click.pass_context
def submit_command(ctx: click.Context, manifest: str, out: str, nodes: int, gpus_per_node: int,
                   procs_per_node: int | None, cpus_per_task: int | None, partition: str | None,
                   time_limit: str | None, array: int | None, account: str | None, signal_grace: int, requeue: bool,
                   extra_sbatch: tuple[str, ...], job_name: str, log_dir: str, setup: tuple[str, ...], python: str,
                   dry_run: bool) -> None:
    """Render an sbatch script that runs `gen run MANIFEST --out OUT ...` on NODES nodes, and submit it.

    \b
    Every option gen submit does not know is passed to gen run unchanged (and checked by gen run's parser
    now): layout (--dp --cfg --ring --ulysses --fsdp), --model, --steps, --backend gloo, --storage-option...
    Prints the job id (with --dry-run: the script). The job requeues itself when the run is preempted or
    reaches its time limit, and resumes where it stopped.

    \b
    Example:  gen submit prompts.parquet --out s3://bucket/run --nodes 2 --gpus-per-node 8 \\
                  --partition gpu --time 04:00:00 --ulysses 4 --cfg 2
    """
    from genbatch.slurm.sbatch import SbatchSpec, render_sbatch
    from genbatch.slurm.submit import submit_script

    run_args = [arg for arg in ctx.args if arg != "--"]
    if array and any(arg == "--share" or arg.startswith("--share=") for arg in run_args):
        raise click.UsageError("--array sets each task's share itself; drop --share (or drop --array)")
    if procs_per_node is None:
        if gpus_per_node == 0:
            raise click.UsageError("--gpus-per-node 0 needs --procs-per-node N (CPU worker processes per node)")
        procs_per_node = gpus_per_node
    manifest, out, log_dir = _local_abspath(manifest), _local_abspath(out), os.path.abspath(log_dir)
    _check_run_args(manifest, out, run_args)
    run_args = _carry_profile(run_args)
    try:
        spec = SbatchSpec(
            command=(python, "-m", "genbatch", "run", manifest, "--out", out, *run_args),
            python=python, nodes=nodes, procs_per_node=procs_per_node, gpus_per_node=gpus_per_node,
            cpus_per_task=cpus_per_task, time=time_limit, partition=partition, account=account, array=array,
            signal_grace_s=signal_grace, requeue=requeue, job_name=job_name, log_dir=log_dir,
            extra_sbatch=extra_sbatch, setup=setup,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    script = render_sbatch(spec)
    if dry_run:
        click.echo(script, nl=False)
        return
    job_id, script_path = submit_script(script, log_dir, job_name)
    click.echo(f"genbatch: submitted {script_path}; logs in {log_dir}", err=True)
    click.echo(job_id)
