"""Rows whose stale K/V do not fit a rank under --distrifusion are rejected alone, with the numbers; the others
run; an exact layout rejects nothing."""

from __future__ import annotations

from genbatch.manifests import read_jobs
from genbatch.manifests.validate import Rejection
from genbatch.jobs.spec import JobOverrides
from genbatch.models import resolve_model
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.shapes import shape_from_spec
from genbatch.planner.stale_fit import USABLE_FRACTION
from genbatch.runner.stale_rows import reject_unfit
from tests.support.runs import write_manifest


def test_a_row_too_large_for_its_kv_is_rejected_alone_naming_the_numbers(tmp_path):
    rows = [{"id": "small", "prompt": "a fox", "model": "tiny-wan", "width": 32, "height": 32},
            {"id": "large", "prompt": "an owl", "model": "tiny-wan", "width": 128, "height": 96},
            {"id": "small-2", "prompt": "a cat", "model": "tiny-wan", "width": 32, "height": 32}]
    jobs = read_jobs(write_manifest(str(tmp_path / "m.parquet"), rows), overrides=JobOverrides()).jobs
    spec = resolve_model("tiny-wan")
    frames = jobs[0].num_frames

    def kv(width, height):  # 2 x N x d x L, both CFG branches on the rank, fp32
        return 2 * spec.tokens(width, height, frames) * spec.hidden_size * spec.num_layers * 2 * 4

    layout = ParallelDims(distrifusion=2)
    weights = shape_from_spec(spec).parameters * 4
    memory = (weights + (kv(32, 32) + kv(128, 96)) / 2) / USABLE_FRACTION  # the small rows fit, the large not
    kept, rejected = reject_unfit(jobs, layout, memory, element_bytes=4)
    assert [job.id for job in kept] == ["small", "small-2"]
    assert [(r.job_id, r.row, r.column) for r in rejected] == [("large", 1, "width")]
    assert isinstance(rejected[0], Rejection)
    reason = rejected[0].reason
    assert f"{kv(128, 96) / 2 / 1e9:.1f} GB per CFG branch x 2" in reason and "--cfg 2" in reason
    assert "--ulysses" in reason  # the fix: exact sequence parallel keeps no K/V
    assert reject_unfit(jobs, ParallelDims(ulysses=2), memory, 4)[1] == []  # exact: nothing to keep


def test_a_row_with_fewer_token_rows_than_patches_is_rejected_naming_the_patches_that_work(tmp_path):
    rows = [{"id": "tall", "prompt": "a fox", "model": "tiny-wan", "width": 32, "height": 64},
            {"id": "flat", "prompt": "an owl", "model": "tiny-wan", "width": 64, "height": 16}]
    jobs = read_jobs(write_manifest(str(tmp_path / "m.parquet"), rows), overrides=JobOverrides()).jobs
    kept, rejected = reject_unfit(jobs, ParallelDims(pp=2), 1e15, element_bytes=4, patches=4)
    assert [job.id for job in kept] == ["tall"]  # 4 token rows in each of 3 latent frames: 12 rows
    ((job_id, column, reason),) = [(r.job_id, r.column, r.reason) for r in rejected]
    assert (job_id, column) == ("flat", "height")  # 1 token row in each of 3 latent frames: 3 rows
    assert "3 token rows, too few for --patches 4" in reason and "use --patches 3 or fewer" in reason
