"""`gen validate` through click's CliRunner against the real `gen` command group."""

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from genbatch.cli import main


def gen(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_clean_manifest_exits_0_with_a_summary(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", "q"], model=[None, "tiny-flux"], category=["x", "y"])
    result = gen("validate", path, "--model", "tiny-wan")
    assert result.exit_code == 0, result.output
    assert f"{path}: 2 rows, 2 valid, 0 rejected" in result.output
    assert "tiny-wan: 1 valid, 0 rejected" in result.output and "tiny-flux: 1 valid, 0 rejected" in result.output
    assert "extra columns: category" in result.output


def test_rejected_rows_exit_1_and_name_row_id_column(write_manifest):
    path = write_manifest(id=["a", "b", "a"], prompt=["p", "", "r"], width=[64, 100, None])
    result = gen("validate", path, "--model", "tiny-wan")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert "row 1 (id 'b'): column 'prompt': empty prompt; give the row a prompt" in lines
    assert "row 1 (id 'b'): column 'width': 100 is not a multiple of 16 (use 96)" in lines
    assert "row 2 (id 'a'): column 'id': duplicate id, first used on row 0; ids must be unique" in lines
    assert f"{path}: 3 rows, 1 valid, 2 rejected (3 problems)" in lines


@pytest.mark.parametrize(
    ("columns", "column", "fix"),
    [
        ({"prompt": ["p"]}, "id", "add a 'id' column"),
        ({"id": ["a"]}, "prompt", "add a 'prompt' column"),
        ({"id": ["a"], "prompt": ["p"], "width": pa.array(["64"])}, "width", "cast it"),
        ({"id": ["a"], "prompt": ["p"], "num_inference_steps": pa.array([2.0])}, "num_inference_steps", "Int64"),
    ],
)
def test_file_level_errors_exit_2_naming_column_and_fix(write_manifest, columns, column, fix):
    result = gen("validate", write_manifest(**columns))
    assert result.exit_code == 2
    assert repr(column) in result.output and fix in result.output
    assert result.output.startswith("error: ")


def test_not_parquet_exits_2(tmp_path):
    path = tmp_path / "m.parquet"
    path.write_bytes(b"id,prompt\nx,y\n")
    result = gen("validate", str(path))
    assert result.exit_code == 2 and "not a Parquet file" in result.output


def test_run_level_options_apply_to_rows_without_values(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", "q"], width=[64, None], model=[None, "tiny-wan"])
    wan = ("--model", "tiny-wan")
    # 72 is not a multiple of 16: a run-level size the run's model cannot take stops everything (exit 2)
    assert gen("validate", path, *wan, "--width", "72").exit_code == 2
    result = gen("validate", path, *wan, "--width", "80", "--frames", "13", "--steps", "2", "--guidance", "0",
                 "--fps", "4")
    assert result.exit_code == 0, result.output
    assert gen("validate", path, "--model", "tiny-flux").exit_code == 0
    # frames apply to video only: fine for the run's image model; row b's own video model meets it row by row
    assert gen("validate", path, "--model", "tiny-flux", "--frames", "10").exit_code == 1
    assert gen("validate", path, *wan, "--frames", "10").exit_code == 2


def test_bad_options_are_usage_errors(write_manifest):
    path = write_manifest(id=["a"], prompt=["p"])
    assert gen("validate", path, "--width", "0").exit_code == 2
    assert gen("validate", path, "--guidance", "-1").exit_code == 2
    result = gen("validate", path, "--storage-option", "novalue")
    assert result.exit_code == 2 and "key=value" in result.output


def test_unknown_run_model_is_a_usage_error(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", "q"], model=[None, "tiny-flux"])
    result = gen("validate", path, "--model", "no-such-model")
    assert result.exit_code == 2
    assert result.output.startswith("error: --model 'no-such-model': model 'no-such-model' is not a preset")


def test_unknown_row_model_rejects_its_rows(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", "q"], model=["no-such-model", "tiny-flux"])
    result = gen("validate", path)
    assert result.exit_code == 1
    assert "row 0 (id 'a'): column 'model': model 'no-such-model' is not a preset" in result.output
    assert "no-such-model: 0 valid, 1 rejected" in result.output


def test_json_report(write_manifest):
    path = write_manifest(id=["a", "b"], prompt=["p", ""], category=["x", "y"])
    result = gen("validate", path, "--json", "--model", "tiny-wan")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert (report["rows"], report["valid"], report["rejected"], report["exit_code"]) == (2, 1, 1, 1)
    assert report["problems"] == [
        {"row": 1, "id": "b", "column": "prompt", "reason": "empty prompt; give the row a prompt", "model": "tiny-wan"}
    ]
    assert report["by_model"] == {"tiny-wan": {"valid": 1, "rejected": 1}}
    assert report["extra_columns"] == ["category"] and report["file_error"] is None and report["option_error"] is None


def test_json_report_of_a_file_error(write_manifest):
    result = gen("validate", write_manifest(prompt=["p"]), "--json")
    assert result.exit_code == 2
    report = json.loads(result.output)
    assert report["file_error"]["column"] == "id" and "add a 'id' column" in report["file_error"]["message"]


def test_storage_options_reach_the_filesystem(s3_run):
    import fsspec
    import pyarrow.parquet as pq

    from .conftest import manifest_table

    url = f"{s3_run.url}/m.parquet"
    with fsspec.open(url, "wb", **s3_run.storage_options) as handle:
        pq.write_table(manifest_table(id=["a"], prompt=["p"]), handle)
    options = s3_run.storage_options
    flags = [
        "--storage-option",
        f"key={options['key']}",
        "--storage-option",
        f"secret={options['secret']}",
        "--storage-option",
        f"endpoint_url={options['endpoint_url']}",
        "--storage-option",
        f"client_kwargs.region_name={options['client_kwargs']['region_name']}",
    ]
    assert gen("validate", url, *flags, "--model", "tiny-wan").exit_code == 0
    # without the endpoint the file cannot be reached: a file-level error, not a crash
    unreachable = ["endpoint_url=http://127.0.0.1:9", "config_kwargs.retries.max_attempts=1", "retries=1"]
    result = gen("validate", url, *flags[:4], *[arg for item in unreachable for arg in ("--storage-option", item)])
    assert result.exit_code == 2 and "error:" in result.output
