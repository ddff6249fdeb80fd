"""Imports run one way: the import contracts in pyproject.toml hold, and they catch an import that breaks them.

`lint-imports` (import-linter, in the `test` extras) reads the contracts from pyproject.toml: the layers of
docs/design.md section 1, lazy imports included, every subpackage placed in a layer, no import cycle between
subpackages (siblings of one layer included), and a package module that imports none of its subpackages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """`lint-imports` over the `genbatch` package found in `package_parent`, with the repository's contracts."""
    executable = Path(sys.executable).with_name("lint-imports")
    if not executable.exists():
        pytest.fail(f"{executable} is missing: install the test extras (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(executable), "--no-cache", "--no-logo", str(PYPROJECT)], cwd=package_parent,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, f"an import runs against the layers of docs/design.md section 1:\n{result.stdout}{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout


# (module to edit, source appended to it, text the broken contract must name)
BREAKS = {
    "lazy upward import": ("genbatch/io/layout.py", "\n\ndef _late():\n    from genbatch.runner import world\n",
                           "genbatch.io is not allowed to import genbatch.runner"),
    "module-level upward import": ("genbatch/parallel/cfg.py", "\nfrom genbatch.runner.timing import JobTimer\n",
                              "genbatch.parallel is not allowed to import genbatch.runner"),
    "package module importing down": ("genbatch/__init__.py", "\nfrom genbatch.io import layout\n",
                                      "genbatch -> genbatch.io.layout"),
    "cycle between siblings of one layer": ("genbatch/slurm/cli.py", "\n\ndef _late():\n    from genbatch.cli import main\n",
                                            "- .slurm -> .cli (1 import)"),
    "subpackage without a layer": ("genbatch/extras/__init__.py", '"""Not in any layer."""\n', "genbatch.extras"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_broken_import_fails_the_contracts(case, tmp_path):
    path, source, named = BREAKS[case]
    shutil.copytree(ROOT / "genbatch", tmp_path / "genbatch", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(source)
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert named in result.stdout, result.stdout
