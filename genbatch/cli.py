"""The `gen` command: argument handling only; each subcommand calls into its subpackage."""

from __future__ import annotations

import click

from genbatch import __version__


class CommandsInOrder(click.Group):
    """A group whose help lists its commands in the order they were added (the order of a run's life), each
    once, with its short help."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=CommandsInOrder, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="gen")
def main() -> None:
    """genbatch: turn a Parquet manifest of prompts into images and videos, on one GPU or a cluster.

    `gen COMMAND --help` says what a command takes; the docs say more.
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
    from genbatch.report.cli import report_command
    from genbatch.runner.cli import run_command, status_command
    from genbatch.slurm.cli import submit_command

    for command in (run_command, validate_command, status_command, report_command, submit_command, plan_command,
                    bench_command):
        main.add_command(command)


_register()
