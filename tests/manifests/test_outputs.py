"""`num_outputs`: a row makes K jobs `<id>-0` to `<id>-(K-1)`, seeded with the row's seed plus k (or each
id's own hash); K = 1 keeps the row as it was; a derived id another row has, or a bad count, rejects its row
alone; results rows carry the row's id in `source_id`; a rerun skips the outputs done."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.jobs.inputs.num_outputs import MAX_OUTPUTS
from genbatch.jobs.seeds import seed_from_id
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import ManifestFileError, ManifestReader, iter_checked, read_jobs
from tests.support.runs import run_cli, write_manifest as write_rows

FLUX = JobOverrides(model="tiny-flux")


def _read(write_manifest, **columns):
    return read_jobs(write_manifest(**columns), overrides=FLUX)


def test_a_row_becomes_its_outputs_with_their_ids_and_seeds(write_manifest):
    result = _read(write_manifest, id=["cat", "dog", "owl"], prompt=["a", "b", "c"], seed=[10, None, 4],
                   num_outputs=[3, 2, None])
    jobs = list(result.jobs)
    assert [job.id for job in jobs] == ["cat-0", "cat-1", "cat-2", "dog-0", "dog-1", "owl"]
    assert [job.seed for job in jobs] == [10, 11, 12, seed_from_id("dog-0"), seed_from_id("dog-1"), 4]
    assert [job.row for job in jobs] == [0, 0, 0, 1, 1, 2]  # the manifest row, not the job's position
    assert [job.record()["source_id"] for job in jobs] == ["cat"] * 3 + ["dog"] * 2 + ["owl"]
    assert jobs[1].prompt == "a" and jobs[1].source_id == "cat" and jobs[-1].source_id is None
    assert [result.jobs[index].id for index in (2, -1)] == ["cat-2", "owl"]  # built on access, as iterated
    assert result.rows == 3 and not result.rejected


def test_one_output_keeps_the_row_exactly(write_manifest):
    plain = _read(write_manifest, id=["a", "b"], prompt=["p", "q"], seed=[None, 3])
    ones = _read(write_manifest, id=["a", "b"], prompt=["p", "q"], seed=[None, 3],
                 num_outputs=pa.array([1, None], pa.int64()))
    assert list(ones.jobs) == list(plain.jobs) and [job.id for job in plain.jobs] == ["a", "b"]
    assert [job.record() for job in ones.jobs] == [job.record() for job in plain.jobs]
    assert [job.seed for job in plain.jobs] == [seed_from_id("a"), 3]
    assert all(job.source_id is None and job.record()["source_id"] == job.id for job in plain.jobs)
    assert plain.jobs.column("id").to_pylist() == plain.jobs.column("source_id").to_pylist() == ["a", "b"]


def test_a_float_column_of_whole_numbers_counts(write_manifest):  # pandas' integers with nulls
    result = _read(write_manifest, id=["a", "b"], prompt=["p", "q"], num_outputs=pa.array([2.0, None]))
    assert [job.id for job in result.jobs] == ["a-0", "a-1", "b"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (0, "0 outputs: a row makes at least one"),
        (-2, "-2 outputs: a row makes at least one"),
        (2.5, "2.5 is not a whole number"),
        (float("nan"), "nan is not a whole number"),
        (MAX_OUTPUTS + 1, f"more than the {MAX_OUTPUTS} one row may make"),
    ],
)
def test_a_bad_count_rejects_its_row_alone(write_manifest, value, reason):
    kind = pa.float64() if isinstance(value, float) else pa.int64()
    result = _read(write_manifest, id=["good", "bad", "next"], prompt=["p", "q", "r"],
                   num_outputs=pa.array([2, value, None], kind))
    assert [job.id for job in result.jobs] == ["good-0", "good-1", "next"]
    [rejection] = result.rejected
    assert (rejection.row, rejection.job_id, rejection.column) == (1, "bad", "num_outputs")
    assert reason in rejection.reason and "use an integer from 1 to 1000" in rejection.reason
    assert rejection.message().startswith("row 1 (id 'bad'): column 'num_outputs': ")


@pytest.mark.parametrize(
    ("ids", "counts", "rejected", "column", "reason"),
    [
        # a later row's id is an id an earlier row derives
        (["cat", "dog", "cat-1"], [2, None, None], 2, "id", "'cat-1' is already a job id of row 0"),
        # a later row derives an earlier row's id
        (["cat-1", "dog", "cat"], [None, None, 2], 2, "num_outputs", "derives 'cat-1', already the id of row 0"),
        (["a", "x", "a-1"], [2, None, 2], 2, "id", "'a-1' is already a job id of row 0"),
        (["a-1", "x", "a"], [2, None, 12], 2, "num_outputs", "derives 'a-1', already the id of row 0"),
        (["a-1", "x", "a-1-0"], [2, None, 1], 2, "id", "'a-1-0' is already a job id of row 0"),
        (["b-0", "b-1", "b"], [None, 2, 3], 2, "num_outputs",
         "derives 'b-0', already the id of row 0 (and 1 more of this row's ids)"),
    ],
)
def test_a_derived_id_another_row_has_rejects_the_later_row_alone(write_manifest, ids, counts, rejected, column,
                                                                  reason):
    result = _read(write_manifest, id=ids, prompt=["p"] * len(ids), num_outputs=pa.array(counts, pa.int64()))
    [rejection] = result.rejected
    assert (rejection.row, rejection.job_id, rejection.column) == (rejected, ids[rejected], column)
    assert reason in rejection.reason and "job ids must be unique" in rejection.reason
    assert {job.row for job in result.jobs} == set(range(len(ids))) - {rejected}  # the others go on
    assert len({job.id for job in result.jobs}) == len(result.jobs)


def test_collisions_each_way_and_duplicates_said_once(write_manifest):
    # 'a-1' x 2 derives 'a-1-0', 'a-1-1'; 'a' x 2 derives 'a-0', 'a-1'; 'a-1-0' x 1 is that id
    result = _read(write_manifest, id=["a-1", "a", "a-1-0"], prompt=["p"] * 3, num_outputs=[2, 2, None])
    assert [(rejection.row, rejection.column) for rejection in result.rejected] == [(1, "num_outputs"), (2, "id")]
    assert "derives 'a-1', already the id of row 0" in result.rejected[0].reason
    assert "'a-1-0' is already a job id of row 0 (from its num_outputs)" in result.rejected[1].reason
    assert [job.id for job in result.jobs] == ["a-1-0", "a-1-1"]
    # two rows derive the same ids only when their own ids are equal: the duplicate rule says it, alone
    twice = _read(write_manifest, id=["a", "a"], prompt=["p"] * 2, num_outputs=[2, 2])
    assert [(rejection.row, rejection.column) for rejection in twice.rejected] == [(1, "id")]
    assert "duplicate id, first used on row 0" in twice.rejected[0].reason


def test_derived_ids_must_still_name_files_and_seeds_fit(write_manifest):
    long_id = "x" * 199  # fine alone, 201 bytes as 'x...-0'
    result = _read(write_manifest, id=[long_id, "top", "ok"], prompt=["p"] * 3, seed=[None, 2**63 - 2, 2**63 - 2],
                   num_outputs=[2, 3, 2])
    by_row = {rejection.row: rejection for rejection in result.rejected}
    assert by_row[0].column == "id" and "makes ids of up to 201 bytes" in by_row[0].reason
    assert "keep this one to 198 bytes" in by_row[0].reason
    assert by_row[1].column == "seed" and "plus 2 (one seed per output, num_outputs 3)" in by_row[1].reason
    assert [(job.id, job.seed) for job in result.jobs] == [("ok-0", 2**63 - 2), ("ok-1", 2**63 - 1)]


def test_a_string_column_is_refused_naming_it(write_manifest):
    with pytest.raises(ManifestFileError, match="column 'num_outputs' has type string, but it must be an integer"):
        _read(write_manifest, id=["a"], prompt=["p"], num_outputs=["2"])


def test_source_id_is_reserved(write_manifest):
    with pytest.raises(ManifestFileError, match="extra column 'source_id' clashes"):
        _read(write_manifest, id=["a"], prompt=["p"], source_id=["x"])


def test_rows_are_checked_as_their_jobs(write_manifest):
    path = write_manifest(id=["a", "b", "a-0"], prompt=["p", "q", "r"], num_outputs=[2, None, None])
    with ManifestReader(path) as reader:
        outcomes = list(iter_checked(reader, FLUX))
    assert [[job.id for job in outcome] for outcome in outcomes[:2]] == [["a-0", "a-1"], ["b"]]
    assert isinstance(outcomes[0], tuple) and isinstance(outcomes[2], list) and outcomes[2][0].column == "id"


def test_a_rows_missing_image_rejects_it_once_by_its_own_id(write_manifest, tmp_path):
    path = write_manifest(id=["edit", "plain"], prompt=["p", "q"], model=["tiny-flux-kontext", None],
                          image=["missing.png", None], num_outputs=[3, 2])
    result = read_jobs(path, overrides=FLUX)
    assert [(rejection.row, rejection.job_id, rejection.column) for rejection in result.rejected] == [
        (0, "edit", "image")]
    assert [job.id for job in result.jobs] == ["plain-0", "plain-1"]


def test_gen_validate_says_how_many_jobs_the_rows_make(write_manifest):
    path = write_manifest(id=["a", "b", "a-1"], prompt=["p", "q", "r"], num_outputs=[3, None, None])
    result = run_cli("validate", path, "--model", "tiny-flux")
    assert result.returncode == 1
    assert f"{path}: 3 rows, 2 valid, 1 rejected (1 problem" in result.stdout
    assert "num_outputs: 2 valid rows -> 4 jobs" in result.stdout
    assert "row 2 (id 'a-1'): column 'id': 'a-1' is already a job id of row 0" in result.stdout
    report = json.loads(run_cli("validate", path, "--model", "tiny-flux", "--json").stdout)
    assert (report["rows"], report["valid"], report["jobs"], report["rejected"]) == (3, 2, 4, 1)
    plain = run_cli("validate", write_manifest(id=["a"], prompt=["p"]), "--model", "tiny-flux")
    assert plain.returncode == 0 and "num_outputs" not in plain.stdout


def test_gen_run_makes_each_output_records_its_row_and_resumes_by_job(tmp_path):
    rows = [
        {"id": "cat", "prompt": "a cat", "seed": 7, "num_outputs": 2, "num_inference_steps": 1},
        {"id": "solo", "prompt": "a cat", "seed": 7, "num_inference_steps": 1},  # what cat-0 is
        {"id": "cat-1", "prompt": "a dog", "num_inference_steps": 1},  # cat's second output's id: rejected
    ]
    manifest = write_rows(str(tmp_path / "m.parquet"), rows)
    out = tmp_path / "out"
    first = run_cli("run", manifest, "--out", str(out), "--model", "tiny-flux", "-q")
    assert first.returncode == 1, first.stderr  # the rejected row: work not done
    assert sorted(path.name for path in (out / "outputs").iterdir()) == ["cat-0.png", "cat-1.png", "solo.png"]
    outputs = {name: (out / "outputs" / f"{name}.png").read_bytes() for name in ("cat-0", "cat-1", "solo")}
    assert outputs["cat-0"] == outputs["solo"] != outputs["cat-1"]  # seed 7 and seed 8
    table = pq.read_table(out / "results" / "results.parquet").to_pylist()
    results = {row["id"]: row for row in table if row["status"] == "done"}
    assert {job_id: (row["status"], row["source_id"], row["row"], row["seed"]) for job_id, row in results.items()
            } == {"cat-0": ("done", "cat", 0, 7), "cat-1": ("done", "cat", 0, 8), "solo": ("done", "solo", 1, 7)}
    # the rejected row of the same id is a results row of its own
    assert [(row["id"], row["row"]) for row in table if row["status"] == "rejected"] == [("cat-1", 2)]
    rejected = pq.read_table(out / "rejected" / "rejected.parquet").to_pylist()
    assert [(row["row"], row["id"], row["column"]) for row in rejected] == [(2, "cat-1", "id")]
    status = json.loads(run_cli("status", str(out), "--json").stdout)
    assert (status["total"], status["done"], status["pending"], status["rejected"]) == (4, 3, 0, 1)
    rows[0]["num_outputs"] = 3  # one more seed of the row: the rerun makes that job alone
    write_rows(manifest, rows)
    assert json.loads(run_cli("status", str(out), "--json").stdout)["pending"] == 1
    second = run_cli("run", manifest, "--out", str(out), "--model", "tiny-flux", "-q")
    assert second.returncode == 1, second.stderr
    attempts: dict[str, set[str]] = {}
    for row in pq.read_table(out / "timings").to_pylist():
        if row["stage"] == "write":
            attempts.setdefault(row["run_id"], set()).add(row["job_id"])
    assert sorted(attempts.values(), key=len) == [{"cat-2"}, {"cat-0", "cat-1", "solo"}]
    results = {row["id"]: row for row in pq.read_table(out / "results" / "results.parquet").to_pylist()
               if row["status"] == "done"}
    assert (results["cat-2"]["status"], results["cat-2"]["source_id"], results["cat-2"]["seed"]) == ("done", "cat", 9)
    assert json.loads(run_cli("status", str(out), "--json").stdout)["pending"] == 0
