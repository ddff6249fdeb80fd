"""Reading through fsspec (local paths, memory://, a real S3 server), batch by batch, never the whole file."""

import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import ManifestReader, read_jobs, validate_manifest

from .conftest import manifest_table


@pytest.fixture
def memory_url():
    url = f"memory://manifests-{uuid.uuid4().hex}/manifest.parquet"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    fs.rm(path.rsplit("/", 1)[0], recursive=True)


def test_local_path_and_file_url_and_memory_url_read_the_same(tmp_path, memory_url):
    table = manifest_table(id=["a", "b"], prompt=["a cat", "a dog"], category=["x", "y"])
    pq.write_table(table, tmp_path / "m.parquet")
    with fsspec.open(memory_url, "wb") as handle:
        pq.write_table(table, handle)
    results = [
        read_jobs(url, overrides=JobOverrides(model="tiny-wan"))
        for url in (str(tmp_path / "m.parquet"), f"file://{tmp_path}/m.parquet", memory_url)
    ]
    records = [[job.record() for job in result.jobs] for result in results]
    assert records[0] == records[1] == records[2]
    assert [r["category"] for r in records[0]] == ["x", "y"]


def test_row_groups_are_read_batch_by_batch(tmp_path):
    rows = 10_000
    table = manifest_table(id=[f"j{i}" for i in range(rows)], prompt=["p"] * rows)
    pq.write_table(table, tmp_path / "m.parquet", row_group_size=2_500)
    with ManifestReader(str(tmp_path / "m.parquet"), batch_rows=1_000) as reader:
        assert (reader.rows, reader.row_groups) == (rows, 4)
        sizes = [batch.num_rows for batch in reader.record_batches()]
        firsts = [first for first, _ in reader.batches()]
    # 4 row groups of 2,500 rows, each cut into batches of at most 1,000 rows
    assert sizes == [1_000, 1_000, 500] * 4
    assert firsts == list(np.cumsum([0] + sizes[:-1]))


def test_reader_must_be_opened(tmp_path):
    with pytest.raises(RuntimeError, match="context manager"):
        _ = ManifestReader(str(tmp_path / "m.parquet")).rows
    with pytest.raises(ValueError, match="batch_rows=0"):
        ManifestReader("x", batch_rows=0)


def test_200k_rows_stream_with_bounded_arrow_memory(tmp_path):
    """A 200,000-row manifest in 40 row groups validates while Arrow holds a small fraction of the table."""
    rows = 200_000
    index = np.arange(rows)
    table = pa.table(
        {
            "id": pa.array([f"job-{i:07d}" for i in range(rows)]),
            "prompt": pa.array([f"prompt number {i}, a cat on a roof at dusk" for i in range(rows)]),
            "model": pa.array(np.where(index % 2 == 0, "tiny-wan", "tiny-flux")),
            "width": pa.array(np.where(index % 1000 == 7, 100, 64)),  # every 1000th row is rejected
            "seed": pa.array(np.where(index % 3 == 0, index, -1)).cast(pa.int64()),
            "category": pa.array([f"c{i % 7}" for i in range(rows)]),
        }
    )
    table_bytes = table.nbytes
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=5_000)
    del table
    baseline = pa.total_allocated_bytes()

    peak = 0
    batches = 0
    with ManifestReader(str(path), batch_rows=8_192) as reader:
        assert reader.row_groups == 40
        for _ in reader.batches():
            batches += 1
            peak = max(peak, pa.total_allocated_bytes() - baseline)
    assert batches == 40  # one batch per row group: the reader never asks for more than one at a time
    assert peak < table_bytes / 8, (peak, table_bytes)

    report = validate_manifest(str(path))
    assert (report.rows, report.valid, report.rejected) == (rows, rows - 200, 200)
    assert {p.column for p in report.problems} == {"width"}
    assert report.by_model["tiny-wan"].valid + report.by_model["tiny-flux"].valid == rows - 200


def test_s3_manifest_through_storage_options(s3_run):
    """A real S3 API (moto_server; also Ceph RGW when configured): the options reach s3fs."""
    table = manifest_table(id=["a", "b"], prompt=["a cat", ""], category=["x", "y"])
    url = f"{s3_run.url}/manifest.parquet"
    with fsspec.open(url, "wb", **s3_run.storage_options) as handle:
        pq.write_table(table, handle)
    result = read_jobs(url, overrides=JobOverrides(model="tiny-wan"), storage_options=s3_run.storage_options)
    assert [job.id for job in result.jobs] == ["a"] and [r.column for r in result.rejected] == ["prompt"]
    assert result.jobs[0].extra == {"category": "x"}
