"""`gen run` stops before any work on a run-level problem (exit 2, one message naming the flag and the fix),
says a cause shared by many rows once, and does not exit 0 when every row was rejected."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.runs import run_cli as gen

ROWS = 2000


@pytest.fixture(scope="module")
def big_manifest(tmp_path_factory) -> str:
    """2,000 valid rows that name no model (the run's --model applies to all of them)."""
    path = tmp_path_factory.mktemp("manifest") / "m.parquet"
    pq.write_table(pa.table({"id": [f"row-{i}" for i in range(ROWS)], "prompt": ["a fox"] * ROWS}), path)
    return str(path)


def _nothing_made(out) -> bool:
    return not (out / "outputs").exists() and not (out / "done").exists() and not (out / "rejected").exists()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--model", "/typo/dir"), ["--model '/typo/dir'", "is not a preset", "model_index.json"]),
        (("--model", "tiny-wam"), ["--model 'tiny-wam'", "did you mean 'tiny-wan'"]),
        (("--model", "tiny-wan", "--width", "72"), ["--width 72", "not a multiple of 16 (use 64)", "tiny-wan"]),
        (("--model", "tiny-wan", "--frames", "10"), ["--frames 10", "4k+1 (use 9)"]),
        ((), ["2000 of 2000 rows have no `model` value and no --model was given", "pass --model"]),
    ],
)
def test_a_run_level_problem_exits_2_with_one_message_naming_the_flag(big_manifest, tmp_path, flags, says):
    out = tmp_path / "out"
    result = gen("run", big_manifest, "--out", str(out), *flags)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one cause, one line: not 2,000 rejections
    assert all(text in lines[0] for text in says), lines[0]
    assert _nothing_made(out)


def test_an_out_that_cannot_be_written_exits_2_naming_out(big_manifest, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = gen("run", big_manifest, "--out", str(blocker / "out"), "--model", "tiny-wan")
    assert result.returncode == 2, result.stderr
    assert f"--out {blocker / 'out'} cannot be written" in result.stderr
    assert "--storage-option" in result.stderr


def test_an_s3_out_in_a_missing_bucket_exits_2_naming_out(big_manifest, s3_run):
    options = s3_run.storage_options
    flags = [f"--storage-option=key={options['key']}", f"--storage-option=secret={options['secret']}",
             f"--storage-option=endpoint_url={options['endpoint_url']}",
             f"--storage-option=client_kwargs.region_name={options['client_kwargs']['region_name']}"]
    missing = f"s3://{s3_run.bucket}-missing/run"
    result = gen("run", big_manifest, "--out", missing, "--model", "tiny-wan", *flags)
    assert result.returncode == 2, result.stderr
    assert f"--out {missing} cannot be written" in result.stderr and "--storage-option" in result.stderr
    # the probe leaves nothing behind in a bucket it could write
    result = gen("run", big_manifest, "--out", s3_run.url, "--model", "no-such-model", *flags)
    assert result.returncode == 2 and "--model 'no-such-model'" in result.stderr
    assert s3_run.endpoint.filesystem().find(s3_run.bucket) == []


def test_a_cause_shared_by_every_row_is_said_once_and_the_run_exits_1(tmp_path):
    """Every row names the same missing model: a row-level cause (each row could name another), reported once
    with its count and first rows; the full list still goes to OUT/rejected/; nothing ran, so not exit 0."""
    manifest, out = tmp_path / "m.parquet", tmp_path / "out"
    ids = [f"row-{i}" for i in range(ROWS)]
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * ROWS, "model": ["/typo/dir"] * ROWS}), manifest)
    result = gen("run", str(manifest), "--out", str(out))
    assert result.returncode == 1, result.stderr
    rejected_lines = [line for line in result.stderr.splitlines() if line.startswith("genbatch: rejected")]
    assert rejected_lines == [
        f"genbatch: rejected {ROWS} rows: column 'model': model '/typo/dir' is not a preset"
        + rejected_lines[0].split("is not a preset", 1)[1]
    ]
    assert rejected_lines[0].endswith("(row 0 (id 'row-0'), row 1 (id 'row-1'), row 2 (id 'row-2') and 1997 more)")
    assert f"{ROWS} rejected rows, each with its reason, in {out}/rejected/" in result.stderr
    assert "every row of" in result.stderr and "was rejected, nothing was run" in result.stderr
    assert len(result.stderr.splitlines()) < 10
    assert pq.read_table(out / "rejected").column("id").to_pylist() == ids


def test_causes_after_the_first_five_are_counted_and_the_valid_rows_run(tmp_path):
    """Seven distinct causes: the first five are said, then how many more; the valid row still runs. (--frames
    is a video setting: it cannot be wrong for the image model the rows name, as for rows' own values.)"""
    rows = [{"id": f"r{i}", "prompt": "p", "model": "tiny-flux", "width": 64 + i, "num_inference_steps": 1}
            for i in range(1, 8)] + [{"id": "ok", "prompt": "p", "model": "tiny-flux", "num_inference_steps": 1}]
    manifest = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist(rows), manifest)
    result = gen("run", str(manifest), "--out", str(tmp_path / "out"), "--model", "tiny-flux", "--frames", "10")
    assert result.returncode == 1 and "1 done, 0 failed, 7 rejected" in result.stderr, result.stderr
    rejected_lines = [line for line in result.stderr.splitlines() if line.startswith("genbatch: rejected")]
    assert len(rejected_lines) == 5, result.stderr
    assert rejected_lines[0] == "genbatch: rejected row 0 (id 'r1'): column 'width': 65 is not a multiple of 16 (use 64)"
    assert "7 rejected rows (2 more causes not shown), each with its reason" in result.stderr


def test_status_counts_rows_against_the_runs_model(big_manifest, tmp_path):
    """A run started with RunOptions(model=...) keeps the model in run.json, not in its overrides: `gen status`
    still resolves the rows that name none with it (pending, not rejected)."""
    from genbatch.io import RunStore
    from genbatch.runner.status import run_status

    out = str(tmp_path / "out")
    RunStore(out).write_run_info({"manifest": big_manifest, "model": "tiny-wan", "overrides": {}})
    assert run_status(out) == {"total": ROWS, "done": 0, "failed": 0, "pending": ROWS, "rejected": 0,
                               "jobs_per_hour": None, "eta_s": None}  # nothing timed yet
