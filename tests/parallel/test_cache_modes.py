"""Step-caching modes: the grammar, the manifest's `cache` column (a bad value rejects its row alone), and the
start-up refusals of gen run, gen submit and gen bench (exit 2 naming the modes that run)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.cache import CacheMode, cache_problem, canonical_cache, parse_cache
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs
from tests.support.runs import run_cli, write_manifest


@pytest.mark.parametrize(("text", "mode"), [
    (None, CacheMode()),
    ("none", CacheMode()),
    (" FBC:0.080 ", CacheMode(kind="fbc", threshold=0.08)),
    ("fbc:0", CacheMode(kind="fbc", threshold=0.0)),
    ("taylorseer:3", CacheMode(kind="taylorseer", interval=3)),
    ("TeaCache:0.20", CacheMode(kind="teacache", threshold=0.2)),
])
def test_modes_parse_to_their_canonical_form(text, mode):
    assert parse_cache(text) == mode
    assert canonical_cache(text) == str(mode)
    assert parse_cache(str(mode)) == mode  # the canonical text reads back


@pytest.mark.parametrize(("text", "reason"), [
    ("teacache:-1", "the teacache threshold must be a finite number >= 0"),
    ("fbc", "is not a cache mode"),
    ("fbc:-0.1", "finite number >= 0"),
    ("fbc:nan", "finite number >= 0"),
    ("taylorseer:0", "whole number >= 1"),
    ("taylorseer:1.5", "whole number >= 1"),
    ("magcache:0.1", "is not a cache mode"),
])
def test_a_bad_mode_names_the_problem_and_the_modes_that_run(text, reason):
    problem = cache_problem(text)
    assert reason in problem
    assert "fbc:THRESHOLD" in problem or "e.g." in problem
    with pytest.raises(ValueError, match="cache mode|threshold|interval"):
        JobOverrides(cache=text)


def test_a_bad_cache_value_rejects_its_row_alone(tmp_path):
    url = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "a", "prompt": "a fox", "cache": "fbc:0.1"},
        {"id": "b", "prompt": "an owl", "cache": "teacache:x"},
        {"id": "c", "prompt": "a tree", "cache": None},
    ])
    result = read_jobs(url, overrides=JobOverrides(model="tiny-wan", cache="TAYLORSEER:2"))
    assert {job.id: job.cache for job in result.jobs} == {"a": "fbc:0.1", "c": "taylorseer:2"}
    (rejection,) = result.rejected
    assert (rejection.row, rejection.job_id, rejection.column) == (1, "b", "cache")
    message = rejection.message()
    assert message.startswith("row 1 (id 'b'): column 'cache': 'teacache:x'")
    assert "e.g. teacache:0.2" in message and "leave it null for the run's --cache" in message


def test_the_results_record_carries_the_mode(tmp_path):
    url = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    (job,) = read_jobs(url, overrides=JobOverrides(model="tiny-wan", cache="fbc:0.05")).jobs
    assert job.record()["cache"] == "fbc:0.05"


@pytest.mark.parametrize(("args", "message"), [
    (["--cache", "teacache:0.2"], "TeaCache covers Wan 2.1 T2V 1.3B, Wan 2.1 T2V 14B, FLUX.1-dev. Run tiny-wan "
                                  "with --cache none, fbc:THRESHOLD or taylorseer:INTERVAL"),
    (["--cache", "fbc:x"], "finite number >= 0"),
    (["--cache", "fbc:0.1", "--pp", "2"], "step caching does not run with PipeFusion's stale K/V"),
])
def test_gen_run_refuses_a_mode_that_cannot_run_at_start_up(tmp_path, args, message):
    url = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    result = run_cli("run", url, "--out", str(tmp_path / "out"), "--model", "tiny-wan", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_gen_submit_passes_the_mode_on_and_refuses_a_bad_one(tmp_path):
    base = ["submit", str(tmp_path / "m.parquet"), "--out", str(tmp_path / "run"), "--nodes", "1",
            "--gpus-per-node", "2", "--dry-run"]
    good = CliRunner().invoke(main, [*base, "--cache", "fbc:0.08"], catch_exceptions=False)
    assert good.exit_code == 0, good.output
    assert "--cache fbc:0.08" in " ".join(good.output.replace("\\\n", " ").split())
    bad = CliRunner().invoke(main, [*base, "--cache", "teacache:-0.2"])
    assert bad.exit_code == 2 and "gen run would refuse" in bad.output


def test_gen_bench_passes_the_mode_to_every_layout_run(tmp_path, monkeypatch):
    import genbatch.benchmark.nightly as nightly

    seen = []
    monkeypatch.setattr(nightly, "run_bench", lambda options: seen.append(options) or 0)
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), "--cache", "TAYLORSEER:2"])
    assert result.exit_code == 0, result.output
    assert seen[0].run_args[-2:] == ("--cache", "taylorseer:2")
    refused = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), "--cache", "teacache:nan"])
    assert refused.exit_code == 2 and "teacache threshold" in refused.output
