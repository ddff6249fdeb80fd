"""`gen models`: every name `--model` takes, with its family, task, guidance and default size (argument handling
only; the list is `genbatch.planner.catalog`'s)."""

from __future__ import annotations

import json

import click

from genbatch.planner.catalog import catalog, catalog_lines

LEGEND = (
    "published: --model takes the name or its hub id; gen run reads it from the Hugging Face cache and",
    "  downloads it when missing (gen validate checks it against its published configs when not cached).",
    "preset: built in, small random weights, no download, seconds on a CPU.",
    "plan only: gen plan prices it; no family runs it.",
    "--model also takes any other hub id (org/name[@revision]) and any diffusers pipeline directory.",
)
"""What the kinds mean, printed below the table."""


@click.command("models", short_help="Every name --model takes, with its task, guidance and size.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON records, one per name.")
def models_command(as_json: bool) -> None:
    """List every model name --model takes (gen run, gen validate, gen plan): the published models with their hub
    ids, the built-in tiny presets and the models gen plan alone prices, each with its family, task (text-to-image,
    image-to-video, ...), guidance (CFG, true CFG, embedded, distilled, with the default scale) and default size
    (width x height [x frames]) and steps."""
    entries = catalog()
    if as_json:
        click.echo(json.dumps([item.record() for item in entries], indent=1))
        return
    for line in (*catalog_lines(entries), "", *LEGEND):
        click.echo(line)
