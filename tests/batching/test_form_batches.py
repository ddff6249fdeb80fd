"""Batch formation: deterministic, one key per batch, a prompt's rows together, largest-first kept."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.jobs.batches import batch_id, batch_key, check_size, form_batches
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs


def _jobs(tmp_path, rows):
    path = tmp_path / "manifest.parquet"
    names = list(dict.fromkeys(name for row in rows for name in row))  # every row's columns, not the first's
    pq.write_table(pa.Table.from_pylist([{name: row.get(name) for name in names} for row in rows]), path)
    return read_jobs(str(path), overrides=JobOverrides(model="tiny-flux", width=32, height=32,
                                                       num_inference_steps=2)).jobs


def test_batches_agree_on_their_key_and_hold_at_most_size(tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"p{i % 3}", "width": 32 if i % 4 else 48} for i in range(14)]
    jobs = _jobs(tmp_path, rows)
    batches = form_batches(jobs, 4)
    seen = [job.id for batch in batches for job in batch]
    assert sorted(seen) == sorted(row["id"] for row in rows)  # every job once
    for batch in batches:
        assert 1 <= len(batch) <= 4
        assert len({batch_key(job) for job in batch}) == 1
    # the 48-wide rows (r0, r4, r8, r12) form their own batch
    assert {job.id for job in batches[0]} == {"r0", "r4", "r8", "r12"}
    # within a key, a prompt's rows are next to each other
    rest = [job for batch in list(batches)[1:] for job in batch]
    prompts = [job.prompt for job in rest]
    assert prompts == sorted(prompts, key=prompts.index)
    assert list(batches.sizes()) == [len(batch) for batch in batches]


def test_the_same_state_forms_the_same_batches(tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"p{i % 5}", "seed": i} for i in range(23)]
    jobs = _jobs(tmp_path, rows)
    first = [[job.id for job in batch] for batch in form_batches(jobs, 3)]
    again = [[job.id for job in batch] for batch in form_batches(_jobs(tmp_path, rows), 3)]
    assert first == again
    assert len({batch_id(ids) for ids in first}) == len(first)


def test_size_one_keeps_every_job_alone_in_order(tmp_path):
    jobs = _jobs(tmp_path, [{"id": f"r{i}", "prompt": "same"} for i in range(5)])
    batches = form_batches(jobs, 1)
    assert [[job.id for job in batch] for batch in batches] == [[job.id] for job in jobs]


def test_other_conditioning_or_adapters_never_batch_together(tmp_path):
    rows = [{"id": "a", "prompt": "x", "guidance_scale": 3.5}, {"id": "b", "prompt": "x", "guidance_scale": 4.0},
            {"id": "c", "prompt": "x", "num_inference_steps": 3}, {"id": "d", "prompt": "y", "guidance_scale": 3.5}]
    batches = form_batches(_jobs(tmp_path, rows), 8)
    assert sorted(sorted(job.id for job in batch) for batch in batches) == [["a", "d"], ["b"], ["c"]]


@pytest.mark.parametrize("size", [0, -1, 1.5, True, 10_000])
def test_a_bad_size_names_the_fix(size):
    with pytest.raises(ValueError, match="--batch-size"):
        check_size(size)
