"""The report of a real tiny-suite run: files, timings with a layout column, Markdown, plots, progress."""

from __future__ import annotations

import io
import json
import os

import pyarrow.parquet as pq
from PIL import Image

from genbatch.benchmark.metrics import report_metrics
from genbatch.benchmark.suites import SUITES

SUITE = SUITES["tiny"]


def test_run_succeeds_with_progress(tiny_report):
    assert tiny_report.exit_code == 0, tiny_report.output
    assert "[1/2] single (1 process)" in tiny_report.output
    assert "[2/2] ulysses2 (2 processes)" in tiny_report.output
    assert "report:" in tiny_report.output


def test_timings_hold_every_step_of_every_rank_with_its_layout(tiny_report):
    table = pq.read_table(os.path.join(tiny_report.out, "timings.parquet"))
    rows = table.to_pylist()
    assert {"layout", "world", "job_id", "rank", "stage", "step", "seconds"} <= set(table.column_names)
    steps = SUITE.num_inference_steps
    for layout, world in (("single", 1), ("ulysses2", 2)):
        mine = [row for row in rows if row["layout"] == layout]
        assert {row["world"] for row in mine} == {world}
        denoise = [row for row in mine if row["stage"] == "denoise_step"]
        assert len(denoise) == SUITE.jobs * steps * world
        assert {row["job_id"] for row in denoise} == {row["id"] for row in SUITE.manifest_rows()}
        assert {row["stage"] for row in mine} >= {"text_encode", "denoise_step", "vae_decode", "compress", "write"}
    # the manifest that was measured is in the report
    manifest = pq.read_table(os.path.join(tiny_report.out, "manifest.parquet")).to_pylist()
    assert [row["id"] for row in manifest] == [row["id"] for row in SUITE.manifest_rows()]


def test_summary_matches_the_timings(tiny_report):
    with open(os.path.join(tiny_report.out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    metrics = report_metrics(pq.read_table(os.path.join(tiny_report.out, "timings.parquet")))
    assert list(summary["layouts"]) == ["single", "ulysses2"] == list(metrics)
    for name, item in metrics.items():
        assert summary["layouts"][name]["seconds_per_step"] == item.seconds_per_step
        assert summary["layouts"][name]["jobs"] == SUITE.jobs
        assert summary["layouts"][name]["extra"]["status"] == 0
    assert metrics["single"].efficiency == 1.0
    assert metrics["single"].bytes_per_step == 0  # one rank sends nothing
    assert metrics["ulysses2"].bytes_per_step > 0  # Ulysses' all-to-alls, counted by the ledger
    assert summary["failed_layouts"] == []


def test_markdown_reports_layouts_stages_and_plots(tiny_report):
    with open(os.path.join(tiny_report.out, "report.md"), encoding="utf-8") as handle:
        text = handle.read()
    metrics = report_metrics(pq.read_table(os.path.join(tiny_report.out, "timings.parquet")))
    assert text.startswith("# genbatch benchmark: suite `tiny`")
    assert "2 jobs of 64x48, 9 frames, 4 steps" in text
    table_rows = [line for line in text.splitlines() if line.startswith(("| single |", "| ulysses2 |"))]
    assert len(table_rows) == 6  # throughput, stages, communication
    throughput = next(line for line in table_rows if line.startswith("| single | 1 |"))
    assert f"{metrics['single'].seconds_per_step:.4f}" in throughput and "100%" in throughput
    ulysses = next(line for line in table_rows if line.startswith("| ulysses2 | 2 |"))
    assert f"{metrics['ulysses2'].jobs_per_hour:.1f}" in ulysses
    assert "| layout | text_encode | denoise | vae_decode | compress | write |" in text
    assert "](plots/step_time.png)" in text and "](plots/stages.png)" in text
    assert "Against the baseline" not in text  # no baseline given
    assert "plots/quality.png" not in text  # no --cache: nothing approximate to score


def test_plots_are_real_pngs(tiny_report):
    for name in ("step_time.png", "stages.png"):
        with open(os.path.join(tiny_report.out, "plots", name), "rb") as handle:
            data = handle.read()
        image = Image.open(io.BytesIO(data))
        image.load()
        assert image.format == "PNG"
        assert image.width >= 600 and image.height >= 200
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 10  # drawn lines, bars, text: not a blank canvas


def test_report_links_each_layouts_gallery(tiny_report):
    with open(os.path.join(tiny_report.out, "report.md"), encoding="utf-8") as handle:
        text = handle.read()
    for name in ("single", "ulysses2"):
        link = f"runs/{name}/report/index.html"
        assert f"- [{name}]({link})" in text
        with open(os.path.join(tiny_report.out, link), encoding="utf-8") as handle:
            gallery = handle.read()
        assert gallery.count('<article class="job done"') == 2  # the suite's two jobs, each with its preview
        assert gallery.count("<video ") == 2
