"""Row-level problems reject that row only, each problem named with row, id and column; extras carry through."""

import datetime

import pyarrow as pa
import pytest

from genbatch.models import UnknownModelError, resolve_model
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs

WAN = JobOverrides(model="tiny-wan")
"""The run's model for rows that name none (there is no default model)."""


def problems_of(result, row):
    return {(r.column, r.reason) for r in result.rejected if r.row == row}


def only_problem(write_manifest, overrides=None, **row):
    """Read a manifest of one good row and one row with `row`'s values; return the second row's rejections."""
    columns = {"id": ["good", "bad"], "prompt": ["a cat", "a dog"]}
    for name, value in row.items():
        columns[name] = [columns[name][0] if name in columns else None, value]
    result = read_jobs(write_manifest(**columns), overrides=overrides or JobOverrides(model="tiny-wan"))
    assert [job.id for job in result.jobs] == ["good"]  # the good row is never affected
    assert {r.row for r in result.rejected} == {1}
    return result.rejected


@pytest.mark.parametrize(
    ("row", "column", "reason"),
    [
        ({"prompt": ""}, "prompt", "empty prompt"),
        ({"prompt": "   "}, "prompt", "empty prompt"),
        ({"prompt": None}, "prompt", "empty prompt"),
        ({"width": 0}, "width", "0 must be positive"),
        ({"height": -16}, "height", "-16 must be positive"),
        ({"num_inference_steps": 0}, "num_inference_steps", "0 must be positive"),
        ({"num_frames": -3}, "num_frames", "-3 must be positive"),
        ({"fps": 0}, "fps", "0 must be positive"),
        ({"guidance_scale": -0.5}, "guidance_scale", "-0.5 is negative"),
        ({"guidance_scale": float("nan")}, "guidance_scale", "nan is not a finite number"),
        ({"width": 100}, "width", "100 is not a multiple of 16 (use 96)"),
        ({"height": 40}, "height", "40 is not a multiple of 16"),
        ({"num_frames": 10}, "num_frames", "10 is not of the form 4k+1 (use 9)"),
        ({"model": "no-such-model"}, "model", "'no-such-model' is not a preset"),
        ({"model": ""}, "model", "empty model name"),
        ({"model": "tiny-flux", "num_frames": 9}, "num_frames", "video models only and tiny-flux makes images"),
        ({"model": "tiny-flux", "fps": 8}, "fps", "video models only"),
        ({"seed": 2**63}, "seed", "does not fit in int64"),
    ],
)
def test_each_rejection_reason_names_row_id_and_column(write_manifest, row, column, reason):
    if "seed" in row:  # a uint64 column: int64 cannot hold the value
        rejected = read_jobs(
            write_manifest(id=["good", "bad"], prompt=["a", "b"], seed=pa.array([None, 2**63], pa.uint64())),
            overrides=JobOverrides(model="tiny-wan"),
        ).rejected
    else:
        rejected = only_problem(write_manifest, **row)
    assert len(rejected) == 1
    rejection = rejected[0]
    assert (rejection.row, rejection.job_id, rejection.column) == (1, "bad", column)
    assert reason in rejection.reason
    message = rejection.message()
    assert message.startswith("row 1 (id 'bad'): column ") and repr(column) in message and reason in message


def test_unknown_model_uses_the_model_resolvers_message(write_manifest):
    rejected = only_problem(write_manifest, model="/nowhere/model")
    with pytest.raises(UnknownModelError) as caught:
        resolve_model("/nowhere/model")
    assert rejected[0].reason == str(caught.value)


@pytest.mark.parametrize("damage", ["no transformer config", "vae config not JSON", "config lacks keys"])
def test_an_incomplete_pipeline_directory_rejects_its_rows_naming_the_file(write_manifest, tmp_path, damage):
    """A directory whose model_index.json names a known pipeline but whose component configs are missing or
    broken: its rows are rejected with the reason (the run goes on with the rest), never a crash of the run."""
    model = tmp_path / f"model-{damage.replace(' ', '-')}"
    (model / "transformer").mkdir(parents=True)
    (model / "vae").mkdir()
    (model / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    if damage != "no transformer config":
        (model / "transformer" / "config.json").write_text('{"patch_size": 1}' if damage == "config lacks keys"
                                                           else '{"num_layers": 1}')
    (model / "vae" / "config.json").write_text("{not json" if damage == "vae config not JSON" else "{}")
    (rejection,) = only_problem(write_manifest, model=str(model))
    assert rejection.column == "model"
    assert f"model {str(model)!r} is an incomplete FluxPipeline directory" in rejection.reason
    assert "saved with save_pretrained" in rejection.reason


@pytest.mark.parametrize("bad_id", ["", "  ", None, "a/b", "..", "tab\there", "x" * 201])
def test_ids_that_cannot_name_files_are_rejected(write_manifest, bad_id):
    result = read_jobs(write_manifest(id=["good", bad_id], prompt=["a", "b"]), overrides=JobOverrides(model="tiny-wan"))
    assert [job.id for job in result.jobs] == ["good"]
    (rejection,) = result.rejected
    assert rejection.column == "id" and rejection.row == 1


def test_duplicate_ids_reject_the_second_and_later_occurrences_only(write_manifest):
    result = read_jobs(
        write_manifest(id=["a", "b", "a", "a"], prompt=["1", "2", "3", "4"]), overrides=JobOverrides(model="tiny-wan")
    )
    assert [(job.id, job.prompt) for job in result.jobs] == [("a", "1"), ("b", "2")]
    assert [(r.row, r.column) for r in result.rejected] == [(2, "id"), (3, "id")]
    assert "first used on row 0" in result.rejected[0].message()


def test_every_problem_of_a_row_is_reported(write_manifest):
    result = read_jobs(
        write_manifest(
            id=["a", "a"], prompt=["ok", ""], width=[None, 0], num_frames=[None, 10], guidance_scale=[None, -1.0]
        ),
        overrides=JobOverrides(model="tiny-wan"),
    )
    assert {r.column for r in result.rejected} == {"id", "prompt", "width", "guidance_scale"}
    # num_frames=10 is only checked against the model once width/height/frames are themselves positive
    result = read_jobs(
        write_manifest(id=["a"], prompt=["p"], width=[40], num_frames=[10]), overrides=JobOverrides(model="tiny-wan")
    )
    assert {r.column for r in result.rejected} == {"width", "num_frames"}


def test_a_bad_run_level_value_says_where_it_came_from(write_manifest):
    result = read_jobs(
        write_manifest(id=["a", "b"], prompt=["p", "q"], width=[64, None]),
        overrides=JobOverrides(model="tiny-wan", width=72),
    )
    assert [job.id for job in result.jobs] == ["a"]
    (rejection,) = result.rejected
    assert rejection.column == "width" and "(the run-level option)" in rejection.reason


def test_run_level_frames_do_not_reject_image_rows(write_manifest):
    result = read_jobs(
        write_manifest(id=["v", "i"], prompt=["p", "q"], model=[None, "tiny-flux"]),
        overrides=JobOverrides(model="tiny-wan", num_frames=5, fps=4),
    )
    assert not result.rejected
    assert [(j.num_frames, j.fps) for j in result.jobs] == [(5, 4), (None, None)]


def test_extra_columns_are_carried_into_jobs_and_rejections(write_manifest):
    when = datetime.datetime(2026, 11, 1, 12, 30)
    path = write_manifest(
        id=["a", "b", "c"],
        prompt=["p", "q", ""],
        category=["animals", None, "city"],
        score=pa.array([1, 2, 3], pa.int16()),
        tags=[["x", "y"], [], None],
        meta=[{"k": 1}, {"k": 2}, {"k": 3}],
        when=pa.array([when, None, when], pa.timestamp("us")),
    )
    result = read_jobs(path, overrides=JobOverrides(model="tiny-wan"))
    assert result.extra_columns == ["category", "score", "tags", "meta", "when"]
    assert result.extra_schema.field("score").type == pa.int16()
    assert result.jobs[0].extra == {
        "category": "animals",
        "score": 1,
        "tags": ["x", "y"],
        "meta": {"k": 1},
        "when": when,
    }
    assert result.jobs[1].extra == {"category": None, "score": 2, "tags": [], "meta": {"k": 2}, "when": None}
    assert result.jobs[0].record()["tags"] == ["x", "y"]
    (rejection,) = result.rejected
    assert rejection.extra["category"] == "city" and rejection.model == "tiny-wan"


def test_seed_is_the_rows_or_derived_from_id(write_manifest):
    from genbatch.jobs.seeds import seed_from_id

    result = read_jobs(write_manifest(id=["a", "b"], prompt=["p", "q"], seed=[123, None]), overrides=WAN)
    assert [job.seed for job in result.jobs] == [123, seed_from_id("b")]


def test_rows_keep_their_manifest_index(write_manifest):
    result = read_jobs(write_manifest(id=["a", "b", "c"], prompt=["p", "", "r"]), overrides=WAN)
    assert [(job.id, job.row) for job in result.jobs] == [("a", 0), ("c", 2)]
    assert result.rows == 3 and result.rejected_rows == [1]
