"""A run written before a stage was renamed still reports: its `encode_media` timings and results columns read
as today's `compress` (`genbatch.io.stage_names`), in `gen report`, the timings and `gen bench`'s metrics; a
card shows the row's negative prompt when it had one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from genbatch.benchmark.metrics import report_metrics
from genbatch.io import RunStore, encode_png
from genbatch.io.stage_names import with_current_stages
from genbatch.report.pages import card
from genbatch.report.run_data import job_views, load_run
from tests.support.runs import run_cli


def _old_run(out: str) -> None:
    """A one-job run as an older genbatch wrote it: `encode_media` in its timings and its done marker."""
    store = RunStore(out, attempt="old")
    png = encode_png(np.zeros((16, 16, 3), dtype=np.uint8))
    store.commit("owl", png, "png", {"id": "owl", "row": 0, "model": "tiny-flux", "prompt": "an owl",
                                     "negative_prompt": "blurry", "seed": 1, "denoise_s": 0.5,
                                     "encode_media_s": 0.25, "write_s": 0.01})
    store.append_timings([{"run_id": "old", "job_id": "owl", "rank": 0, "stage": stage, "step": None,
                           "start": start, "seconds": seconds, "layout": "single"}
                          for stage, start, seconds in (("text_encode", 0.0, 0.1), ("denoise_step", 0.1, 0.5),
                                                        ("encode_media", 0.6, 0.25), ("write", 0.85, 0.01))])
    store.flush_timings()


def test_an_old_runs_stage_reads_under_its_new_name_and_the_run_still_reports(tmp_path):
    out = str(tmp_path / "old")
    _old_run(out)
    store = RunStore(out)
    assert "compress" in store.read_timings()["stage"].to_pylist()
    assert "encode_media" not in store.read_timings()["stage"].to_pylist()
    (job,) = load_run(store).jobs
    assert job.stages["compress"] == 0.25 and "encode_media" not in job.stages
    assert list(job.stages) == ["denoise", "compress", "write"]
    result = run_cli("report", out)
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "old" / "report" / "index.html").read_text()
    assert "compress 0.25 s" in page and "encode_media" not in page
    assert 'class="negative-prompt"' in page and "blurry" in page


def test_a_gen_bench_baseline_of_an_old_night_reads_the_new_name():
    old = pa.table({"run_id": ["a"] * 3, "job_id": ["j"] * 3, "rank": [0] * 3, "layout": ["single"] * 3,
                    "world": [1] * 3, "stage": ["denoise_step", "encode_media", "write"], "start": [0.0, 1.0, 2.0],
                    "seconds": [1.0, 0.5, 0.1], "step": [0, None, None]})
    assert report_metrics(old)["single"].stage_seconds["compress"] == 0.5
    assert with_current_stages(old)["stage"].to_pylist() == ["denoise_step", "compress", "write"]


def test_a_card_shows_the_negative_prompt_only_when_the_row_had_one():
    results = pa.table({"id": ["a", "b"], "status": ["done", "done"], "prompt": ["a cat", "a dog"],
                        "negative_prompt": ["low quality <x>", None]})
    with_negative, without = (card(view) for view in job_views(results, {}, "single"))
    assert 'negative:</span> low quality &lt;x&gt;' in with_negative
    assert "negative" not in without
