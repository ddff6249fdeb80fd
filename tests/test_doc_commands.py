"""The commands the documents show work as written. Every `gen` command in a code block of README.md and docs/
(alone, after `torchrun ... -m genbatch` or after `srun ...`) parses: its command exists and takes those options and
values. docs/getting-started.md, then docs/questions.md, run as a newcomer follows them (slow): every code block, as
written and in order, in one clean bash (no virtual environment on `PATH`) in a fresh clone of this tree.

The clone holds this tree's committed files and its uncommitted changes to them (`git stash create`). Its `.venv`
is a link to the environment the tests run in, standing for `make setup`, so nothing is downloaded; `make demo`
therefore runs as `make -o setup demo` (make's "do not remake `setup`"), the demo itself unchanged. `PYTHONPATH`
names the clone, so its genbatch is the one imported whatever tree that environment was installed from, and
`HF_HUB_OFFLINE=1` makes any download the pages would start fail instead. A shell
block runs line by line in the one shell (`set -e`: a failing command fails the test); a `python` block runs as a
file under that shell's `python`.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pyarrow.parquet as pq
import pytest

from genbatch.cli import main

ROOT = Path(__file__).resolve().parents[1]
GUIDE = "docs/getting-started.md"
WALKTHROUGH = (GUIDE, "docs/questions.md")
"""The pages whose blocks run in one shell, in this order: the questions' commands look at the guide's demo."""
SET_UP = "make demo"
"""The one set-up command: the clone's `.venv` stands for its `make setup` part."""
BLOCK = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Each fenced code block of a Markdown text, in order: (language, body); the language is "" when unnamed."""
    return [(language, body) for language, body in BLOCK.findall(text)]


def gen_arguments(line: str) -> list[str] | None:
    """The arguments of the `gen` command a shell line runs (`gen ...`, `torchrun ... -m genbatch ...`, `srun ... gen
    ...`), or None when it runs no `gen` command."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["gen"]:
        return words[1:]
    if words[:1] == ["torchrun"] and "-m" in words and words[words.index("-m") + 1:][:1] == ["genbatch"]:
        return words[words.index("-m") + 2:]
    if words[:1] == ["srun"] and "gen" in words:
        return words[words.index("gen") + 1:]
    return None


def parse_gen(arguments: list[str]) -> None:
    """Parse `gen` `arguments` as the command line would, down to the subcommand's options and their values, without
    running anything; raises `click.UsageError` (or `click.BadParameter`) for what the command line would refuse."""
    name, command, context = "gen", main, None
    while isinstance(command, click.Group):
        context = command.make_context(name, arguments, parent=context)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            arguments = [*getattr(context, "protected_args", []), *context.args]
        name, command, arguments = command.resolve_command(context, arguments)
    command.make_context(name, arguments, parent=context)


def documented_commands() -> list[tuple[str, str]]:
    """(page, line) for every `gen` command line in a shell code block of README.md and docs/ (continuation lines
    joined)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for language, body in code_blocks(page.read_text(encoding="utf-8")):
            if language in ("", "bash", "sh", "console"):
                for line in body.replace("\\\n", " ").splitlines():
                    if line.strip() and gen_arguments(line) is not None:
                        found.append((str(page.relative_to(ROOT)), line.strip()))
    return found


def test_every_documented_gen_command_parses():
    commands = documented_commands()
    assert len(commands) >= 10, f"found only {len(commands)} gen commands in the documents"
    for page, line in commands:
        try:
            parse_gen(gen_arguments(line))
        except click.exceptions.Exit:
            pass  # --help, --version
        except click.ClickException as error:
            raise AssertionError(f"{page}: `{line}` does not parse: {error.format_message()}") from None


def shell_script(blocks: list[tuple[str, str]], scratch: Path) -> str:
    """One bash script running `blocks` in order: shell lines as they are (the set-up command as `make -o setup
    demo`), each python block written under `scratch` and run by the shell's `python`."""
    lines = ["set -ex"]
    for number, (language, body) in enumerate(blocks):
        if language == "python":
            path = scratch / f"block{number}.py"
            path.write_text(body, encoding="utf-8")
            lines.append(f"python {path}")
        elif language in ("", "bash", "sh", "console"):
            lines += ["make -o setup demo" if line.strip() == SET_UP else line for line in body.splitlines()]
        else:
            raise AssertionError(f"a {language!r} block in {WALKTHROUGH}: the test runs shell and python blocks only")
    return "\n".join(lines) + "\n"


def fresh_clone(target: Path) -> Path:
    """A clone of this tree at its working state (committed files with their uncommitted changes)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of genbatch")
    stash = subprocess.run(["git", "-C", str(ROOT), "stash", "create"], capture_output=True, text=True,
                           check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(target)], check=True)
    if stash:
        subprocess.run(["git", "-C", str(target), "checkout", "-q", stash], check=True)
    return target


def test_the_walkthrough_parses_as_shell_and_python():
    blocks = [block for page in WALKTHROUGH for block in code_blocks((ROOT / page).read_text(encoding="utf-8"))]
    commands = [line for language, body in blocks if language != "python" for line in body.splitlines()]
    assert commands[0] == SET_UP, f"{GUIDE}'s first command is the set-up command, {SET_UP!r}"
    assert "source .venv/bin/activate" in commands, f"{GUIDE} says how its shell finds gen"
    assert commands.index("source .venv/bin/activate") < min(i for i, line in enumerate(commands)
                                                              if line.startswith("gen ")), "activate before gen"
    for language, body in blocks:
        if language == "python":
            compile(body, GUIDE, "exec")
        else:
            subprocess.run(["bash", "-n"], input=body, text=True, check=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_walkthrough_runs_as_written_in_a_fresh_clone(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment: there is no .venv to stand for make setup")
    clone = fresh_clone(tmp_path / "genbatch")
    (clone / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    home = tmp_path / "home"
    home.mkdir()
    blocks = [block for page in WALKTHROUGH for block in code_blocks((clone / page).read_text(encoding="utf-8"))]
    script = shell_script(blocks, tmp_path)
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
                   "PYTHONPATH": str(clone), "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", "-c", script], cwd=clone, env=environment, capture_output=True, text=True,
                            timeout=850)
    assert result.returncode == 0, f"{WALKTHROUGH} failed at the last command shown:\n{result.stderr[-6000:]}"

    demo = pq.read_table(clone / "runs/example/results/results.parquet").to_pylist()
    assert demo and {row["status"] for row in demo} == {"done"}
    mine = pq.read_table(clone / "runs/v1/results/results.parquet").to_pylist()
    assert sorted(row["id"] for row in mine) == ["fox", "owl"]
    assert {row["status"] for row in mine} == {"done"}
    assert (clone / "runs/v1/report/index.html").is_file()
    assert "tiny-wan" in result.stdout and "wan2.1-1.3b" in result.stdout, "gen models printed its list"
    assert (clone / "runs/example/report/index.html").is_file(), "the questions' gen report wrote the demo's report"
    assert "no failed jobs" in result.stdout, "gen status --failed of the demo"
