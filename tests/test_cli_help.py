"""The commands' help: `gen run --help` in sections, in a fixed order, every option under one of them; `gen --help`
lists each command once; every suite and mode is named in its command's help, read from the registries."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from genbatch.cli import main

HEADINGS = ("Model and sizes", "Layout", "Memory and speed", "Storage and resume", "Features", "Output")


def _help(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_gen_run_help_lists_every_option_under_its_heading_in_order():
    from genbatch.runner.cli import run_command
    from genbatch.runner.help_sections import OTHER

    text = _help("run")
    headings = re.findall(r"^(\S[^:\n]*):$", text, flags=re.MULTILINE)
    assert headings == list(HEADINGS) and OTHER not in text  # every option has its section
    sections = dict(zip(headings, re.split(r"^\S[^:\n]*:$", text, flags=re.MULTILINE)[1:]))
    assert "--model" in sections["Model and sizes"] and "--ulysses" in sections["Layout"]
    assert "--out" in sections["Storage and resume"] and "--quiet" in sections["Output"]
    for param in run_command.params:
        if isinstance(param, click.Option):
            assert sum(text.count(f"{flag} ") + text.count(f"{flag},") for flag in param.opts[:1]) >= 1, param.opts


def test_gen_help_lists_each_command_once():
    text = _help()
    listing = text.split("Commands:", 1)[1]
    for name in main.commands:
        assert len(re.findall(rf"^  {re.escape(name)}\s", listing, flags=re.MULTILINE)) == 1, name
        assert not re.search(rf"^\s*gen {re.escape(name)}\b", text, flags=re.MULTILINE)  # no hand-kept list


def test_every_suite_and_mode_is_named_in_its_commands_help():
    from genbatch.benchmark.suites import SUITES
    from genbatch.jobs.cache import KINDS

    bench = _help("bench")
    for name in SUITES:
        assert re.search(rf"^\s+{re.escape(name)}\s+\S", bench, flags=re.MULTILINE), name
    run = _help("run")
    for kind in KINDS:
        assert kind in run, kind
    for command_name in ("run", "plan", "bench"):
        text = _help(command_name)
        for param in main.commands[command_name].params:
            if isinstance(param.type, click.Choice):
                for choice in param.type.choices:
                    assert choice in text, (command_name, param.name, choice)
