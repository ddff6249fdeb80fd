"""A report on a real S3 server (moto; Ceph when configured): runs, report and plots land in the bucket,
and a later night reads it back as its baseline. (Compared with a local report, its `write` stage, the
uploads, would differ: a nightly compares like with like.)"""

from __future__ import annotations

import pytest

from genbatch.benchmark.compare import load_baseline
from genbatch.io.options import open_filesystem
from tests.support.runs import gen


@pytest.mark.slow  # gen bench twice against a bucket
def test_report_in_a_bucket_is_a_baseline(s3_run, tiny_report):
    result = gen("bench", "--suite", "tiny", "--layouts", "single", "--out", s3_run.url,
                 "--model-cache", tiny_report.model_cache, env=s3_run.env)
    assert result.returncode == 0, result.stderr
    fs, root, _ = open_filesystem(s3_run.url, s3_run.storage_options)
    for name in ("report.md", "summary.json", "timings.parquet", "manifest.parquet", "plots/step_time.png",
                 "plots/stages.png", "runs/single/results/results.parquet"):
        assert fs.isfile(f"{root}/{name}"), name
    assert "| single | 1 |" in fs.cat_file(f"{root}/report.md").decode()
    baseline = load_baseline(s3_run.url, s3_run.storage_options)
    assert list(baseline) == ["single"] and baseline["single"].jobs == 2
