"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, its CLI reference names
every `gen` command and option, no text is on two pages, and the README stays a short front page into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from genbatch.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as `make docs` builds it (strict: a broken link, anchor or page outside the nav fails)."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                             str(ROOT / "mkdocs.yml"), "-d", str(out)], capture_output=True, text=True,
                            cwd=ROOT, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    return out


def _commands(group: click.Group, prefix: str = "gen"):
    for name, command in sorted(group.commands.items()):
        yield f"{prefix} {name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")


def test_the_site_builds_strict(site):
    for page in ("index.html", "getting-started/index.html", "parallelism/ulysses/index.html",
                 "troubleshooting/index.html", "design/index.html", "cli/index.html"):
        assert (site / page).is_file(), page


def test_the_cli_reference_names_every_command_and_option(site):
    reference = (site / "cli" / "index.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", " ", reference).replace("&amp;", "&")
    commands = list(_commands(main))
    assert len(commands) >= 7
    for name, command in commands:
        assert name in text, f"{name} is missing from the generated CLI reference"
        for parameter in command.params:
            if isinstance(parameter, click.Option) and not parameter.hidden:
                for flag in parameter.opts + parameter.secondary_opts:
                    assert flag in text, f"{name} {flag} is missing from the generated CLI reference"


def _paragraphs(path: Path) -> list[str]:
    """The prose paragraphs of a Markdown file (code blocks, tables and headings left out), whitespace folded."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    blocks = [" ".join(block.split()) for block in re.split(r"\n\s*\n", text)]
    return [block for block in blocks if len(block) >= 120 and not block.startswith(("|", "#", ":::"))]


def test_no_two_pages_carry_the_same_text():
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
    seen: dict[str, Path] = {}
    for page in pages:
        for paragraph in _paragraphs(page):
            assert paragraph not in seen, (f"{page.relative_to(ROOT)} repeats a paragraph of "
                                           f"{seen[paragraph].relative_to(ROOT)}: {paragraph[:100]}...")
            seen[paragraph] = page


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, flags=re.M))
    assert pages == listed, f"pages not in the nav: {pages - listed}; nav entries without a page: {listed - pages}"


def test_the_readme_is_a_short_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for needle in ("make demo", "make test", "The suite (", "--nproc", "torchrun", "srun", "gen submit", "`prompt`"):
        assert needle in readme, needle
    links = re.findall(r"\]\(([^)#]+)", readme)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, f"README links to files that do not exist: {missing}"
