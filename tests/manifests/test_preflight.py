"""Run-level checks before any row (`genbatch.manifests.preflight`) and causes said once (`causes`), through
`gen validate` (the same checks `gen run` makes, see tests/runner/test_run_preflight.py)."""

import json

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.manifests.causes import group_causes
from genbatch.manifests.validate import Rejection

ROWS = 2000


def gen(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def no_model_rows(write_manifest):
    return write_manifest(id=[f"r{i}" for i in range(ROWS)], prompt=["p"] * ROWS)


@pytest.mark.parametrize(
    ("flags", "option", "says"),
    [
        (("--model", "/typo/dir"), "--model", "--model '/typo/dir': model '/typo/dir' is not a preset"),
        (("--model", "tiny-flx"), "--model", "did you mean 'tiny-flux'"),
        (("--model", "tiny-wan", "--height", "50"), "--height", "--height 50 cannot be used with model tiny-wan"),
        (("--model", "tiny-wan", "--frames", "8"), "--frames", "8 is not of the form 4k+1 (use 5)"),
        ((), "--model", f"{ROWS} of {ROWS} rows have no `model` value and no --model was given"),
    ],
)
def test_a_run_level_cause_exits_2_in_one_line(no_model_rows, flags, option, says):
    result = gen("validate", no_model_rows, *flags)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and says in result.output
    report = json.loads(gen("validate", no_model_rows, *flags, "--json").output)
    assert report["exit_code"] == 2 and report["option_error"]["option"] == option
    assert says in report["option_error"]["message"] and report["problems"] == []


def test_rows_that_all_name_their_model_need_no_run_model(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", "q"], model=["tiny-wan", "tiny-flux"])
    assert gen("validate", path).exit_code == 0
    some = write_manifest(id=["a", "b", "c"], prompt=["p", "q", "r"], model=["tiny-wan", None, None])
    result = gen("validate", some)
    assert result.exit_code == 2 and "2 of 3 rows have no `model` value" in result.output


def test_a_run_level_size_for_an_image_model_ignores_frames(write_manifest):
    path = write_manifest(id=["a"], prompt=["p"])
    assert gen("validate", path, "--model", "tiny-flux", "--frames", "8").exit_code == 0


def test_a_row_level_cause_shared_by_many_rows_is_said_once(write_manifest):
    ids = [f"r{i}" for i in range(ROWS)]
    path = write_manifest(id=ids, prompt=["p"] * ROWS, model=["/typo/dir"] * ROWS)
    result = gen("validate", path)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 4, lines  # the cause, the summary, the per-model counts, the extra columns
    assert lines[0].startswith(f"{ROWS} rows: column 'model': model '/typo/dir' is not a preset")
    assert lines[0].endswith("(row 0 (id 'r0'), row 1 (id 'r1'), row 2 (id 'r2') and 1997 more)")
    report = json.loads(gen("validate", path, "--json").output)
    assert [problem["id"] for problem in report["problems"]] == ids  # the full list is still there


def test_group_causes_keeps_first_appearance_order_and_the_first_rows():
    def rejection(row, column, reason):
        return Rejection(row=row, job_id=f"id{row}" if row % 2 else None, column=column, reason=reason)

    causes = group_causes([rejection(0, "width", "w"), rejection(1, "prompt", "p"), rejection(2, "width", "w"),
                           rejection(3, "width", "w"), rejection(4, "width", "w")])
    assert [(cause.column, cause.rows) for cause in causes] == [("width", 4), ("prompt", 1)]
    assert causes[0].message() == (
        "4 rows: column 'width': w (row 0 (no id), row 2 (no id), row 3 (id 'id3') and 1 more)"
    )
    assert causes[1].message() == rejection(1, "prompt", "p").message()
