"""The `gen` command: argument handling only; each subcommand calls into its subpackage."""

from __future__ import annotations

import sys

import click

from genbatch import __version__


ERROR_PREFIX = "error: "
"""How every `gen` command begins the line of an error that stops it: click's usage errors and our own alike."""


def show_error(error: click.ClickException) -> None:
    """Print a click error as every `gen` command prints its errors: a usage error's usage line and help hint,
    then `error: MESSAGE` (click's own would say `Error:`)."""
    if isinstance(error, click.UsageError) and error.ctx is not None:
        context = error.ctx
        click.echo(context.get_usage(), err=True)
        if context.command.get_help_option(context) is not None:
            click.echo(f"Try '{context.command_path} {context.help_option_names[0]}' for help.", err=True)
        click.echo(err=True)
    click.echo(f"{ERROR_PREFIX}{error.format_message()}", err=True)


class CommandsInOrder(click.Group):
    """The `gen` group: its help lists the commands in the order they were added (the order of a run's life),
    each once, with its short help; a click error is printed as `error: ...` (`show_error`), its exit status
    kept."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            status = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as error:
            show_error(error)
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(status if isinstance(status, int) else 0)


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
    from genbatch.planner.models_cli import models_command
    from genbatch.report.cli import report_command
    from genbatch.runner.cli import run_command, status_command
    from genbatch.slurm.cli import submit_command

    for command in (run_command, validate_command, status_command, report_command, submit_command, plan_command,
                    models_command, bench_command):
        main.add_command(command)


_register()
