"""File-level problems: the whole manifest is refused with ManifestFileError naming the column and the fix."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import ManifestFileError, read_jobs

from .conftest import manifest_table


def refused(path, **kwargs) -> ManifestFileError:
    with pytest.raises(ManifestFileError) as caught:
        read_jobs(path, overrides=JobOverrides(model="tiny-wan"), **kwargs)
    return caught.value


def test_not_parquet(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text("id,prompt\na,a cat\n")
    error = refused(str(path))
    assert "not a Parquet file" in str(error) and "write_table" in str(error)


def test_missing_file(tmp_path):
    error = refused(str(tmp_path / "nope.parquet"))
    assert "no such manifest" in str(error)


@pytest.mark.parametrize("missing", ["id", "prompt"])
def test_required_column_missing(write_manifest, missing):
    columns = {"id": ["a"], "prompt": ["a cat"], "width": [64]}
    del columns[missing]
    error = refused(write_manifest(**columns))
    assert error.column == missing
    assert f"no {missing!r} column" in str(error) and f"add a {missing!r} column" in str(error)


def test_missing_column_suggests_a_near_name(write_manifest):
    error = refused(write_manifest(ID=["a"], prompt=["a cat"]))
    assert error.column == "id" and "rename column 'ID' to 'id'" in str(error)
    error = refused(write_manifest(id=["a"], promt=["a cat"]))
    assert error.column == "prompt" and "rename column 'promt' to 'prompt'" in str(error)


@pytest.mark.parametrize(
    ("column", "array", "fix"),
    [
        ("width", pa.array(["64"]), "astype('Int64')"),
        ("seed", pa.array([1.0]), "Int64 keeps the nulls"),
        ("guidance_scale", pa.array(["5"]), "pa.float64()"),
        ("prompt", pa.array([3]), "astype('string')"),
        ("model", pa.array([True]), "pa.string()"),
    ],
)
def test_wrong_column_type(write_manifest, column, array, fix):
    columns = {"id": ["a"], "prompt": ["a cat"], column: array}
    error = refused(write_manifest(**columns))
    assert error.column == column
    assert f"column {column!r} has type" in str(error) and "cast it" in str(error) and fix in str(error)


def test_extra_column_may_not_take_a_results_name(write_manifest):
    error = refused(write_manifest(id=["a"], prompt=["a cat"], row=[1]))
    assert error.column == "row" and "rename it" in str(error)


def test_duplicate_column_names(tmp_path):
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["p"]), pa.array(["q"])], names=["id", "prompt", "prompt"])
    pq.write_table(table, tmp_path / "dup.parquet")
    error = refused(str(tmp_path / "dup.parquet"))
    assert error.column == "prompt" and "appears 2 times" in str(error)


def test_accepts_every_integer_and_string_flavour(tmp_path):
    table = manifest_table(
        id=pa.array(["a", "b"], pa.large_string()),
        prompt=pa.array(["a cat", "a dog"]).dictionary_encode(),
        negative_prompt=pa.array(["blurry", None], pa.string_view()),
        width=pa.array([64, 32], pa.uint16()),
        height=pa.array([48, None], pa.int8()),
        num_frames=pa.array([9, 5], pa.int32()),
        guidance_scale=pa.array([5, 2], pa.int16()),
        fps=pa.array([None, None], pa.null()),
        seed=pa.array([None, 3], pa.uint64()),
    )
    pq.write_table(table, tmp_path / "types.parquet")
    jobs = read_jobs(str(tmp_path / "types.parquet"), overrides=JobOverrides(model="tiny-wan")).jobs
    assert [(j.id, j.prompt, j.negative_prompt, j.width, j.height) for j in jobs] == [
        ("a", "a cat", "blurry", 64, 48),
        ("b", "a dog", None, 32, 48),
    ]
    assert [j.guidance_scale for j in jobs] == [5.0, 2.0] and isinstance(jobs[0].guidance_scale, float)
    assert jobs[1].seed == 3 and jobs[0].fps == 8
