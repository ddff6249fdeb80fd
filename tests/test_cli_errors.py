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


def test_counts_agree_in_number(tmp_path):
    from genbatch.jobs.counts import counted
    from tests.support.runs import write_manifest

    assert (counted(1, "problem"), counted(2, "problem"), counted(0, "layout")) == ("1 problem", "2 problems",
                                                                                    "0 layouts")
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "a", "prompt": "a fox", "model": "tiny-wan"}, {"id": "b", "prompt": "an owl", "model": "tiny-wan",
                                                              "width": 60}])
    result = _gen("validate", manifest)
    assert result.exit_code == 1 and "2 rows, 1 valid, 1 rejected (1 problem)" in result.stdout
