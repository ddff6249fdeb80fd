"""The `gen` command: argument handling only; each subcommand calls into its subpackage."""

from __future__ import annotations

import click

from genbatch import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="gen")
def main() -> None:
    """genbatch: turn a Parquet manifest of prompts into images and videos, on one GPU or a cluster.

    \b
    gen run MANIFEST --out OUT        generate every row (resumes: done rows are skipped)
    gen validate MANIFEST             check a manifest without running it
    gen status OUT                    done / failed / rejected / pending counts of a run
    gen report OUT                    a static HTML gallery of a run, OUT/report/index.html
    gen submit MANIFEST --out OUT     render and submit an sbatch script
    gen plan --model M --gpus G       rank parallel layouts by estimated speed
    gen models                        every name --model takes: family, task, guidance, default size
    gen bench --out OUT               nightly throughput run with a report
    """
    _quiet_libraries()


def _quiet_libraries() -> None:
    """transformers warns at import about optional image backends the pipelines never use here."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()


def _register() -> None:
    """Each subcommand's click command lives beside the code it drives."""
    from genbatch.benchmark.cli import bench_command
    from genbatch.manifests.cli import validate_command
    from genbatch.planner.cli import plan_command
    from genbatch.planner.models_cli import models_command
    from genbatch.report.cli import report_command
    from genbatch.runner.cli import run_command, status_command
    from genbatch.slurm.cli import submit_command

    for command in (run_command, validate_command, status_command, report_command, submit_command, plan_command,
                    models_command, bench_command):
        main.add_command(command)


_register()
