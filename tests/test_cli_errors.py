"""Every `gen` command says an error that stops it on a line that begins `error: `, click's usage errors and our
own alike, with the exit status the docs give (2: a usage error); `gen status` on a path that is not there says
so and names the fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.exit_codes import USAGE


def _gen(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("args", [
    ("run", "m.parquet"),  # click's own: --out missing
    ("run", "m.parquet", "--out", "o", "--size", "huge"),
    ("validate", "no-such-manifest.parquet"),
    ("validate", "m.parquet", "--model", "tiny-wan", "--size", "720p", "--width", "64"),
    ("plan", "-m", "no-such-model", "-g", "2"),
    ("plan", "-m", "flux.1-dev"),
    ("status", "no-such-run"),
    ("status", "no-such-run", "--failed"),
    ("report", "no-such-run"),
    ("submit", "m.parquet", "--out", "o", "--nodes", "1"),
    ("bench", "--out", "o", "--batch-size", "zero"),
], ids=lambda args: "-".join(args[:1] + args[-1:]))
def test_a_usage_error_is_one_error_line_and_exit_2(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _gen(*args)
    assert result.exit_code == USAGE, result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith(("error", "gen ", "genbatch:"))]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr


def test_status_on_a_mistyped_path_says_it_does_not_exist(tmp_path):
    missing = _gen("status", str(tmp_path / "runs" / "typo"))
    assert missing.exit_code == USAGE
    assert "typo does not exist: give the --out of a `gen run`" in missing.stderr
    assert "--manifest" not in missing.stderr  # counting a manifest against nothing is no fix for a typo
    empty = _gen("status", str(tmp_path))
    assert empty.exit_code == USAGE and "holds no run (no run.json)" in empty.stderr
    assert "--manifest MANIFEST" in empty.stderr
