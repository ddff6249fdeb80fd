"""`gen report` of a real run: the pages, the previews, the filters, reuse, and the summary's numbers."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest
from PIL import Image

from genbatch.io import decode_mp4
from genbatch.report.stats import rank_busy, stage_seconds
from genbatch.report.run_data import JobView, lora_label
from tests.support.runs import run_cli


class _Page(HTMLParser):
    """The cards (status, model, id) and every src/href/poster of one page."""

    def __init__(self, text: str):
        super().__init__()
        self.cards: list[dict] = []
        self.links: list[str] = []
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self.cards.append({"status": attrs["data-status"], "model": attrs["data-model"], "id": None})
        if tag == "h3":
            self._in_title = True
        for name in ("src", "href", "poster"):
            if attrs.get(name):
                self.links.append(attrs[name])

    def handle_data(self, data):
        if self._in_title and self.cards and data not in ("done", "failed", "rejected"):
            self.cards[-1]["id"] = data

    def handle_endtag(self, tag):
        if tag == "h3":
            self._in_title = False


def _page(path: Path) -> _Page:
    return _Page(path.read_text(encoding="utf-8"))


def test_gen_run_report_writes_the_gallery(report_run):
    assert report_run.result.returncode == 1, report_run.result.stderr  # one job failed
    assert f"genbatch: report -> {report_run.report}/index.html" in report_run.result.stderr
    index = (report_run.report / "index.html").read_text(encoding="utf-8")
    page = _Page(index)
    assert {card["id"]: card["status"] for card in page.cards} == {
        "owl": "done", "fox #1": "done", "explodes": "failed", "bad-size": "rejected"}
    counts = re.findall(r"<tr><th>(done|failed|rejected|pending|jobs per hour)</th><td>([^<]+)</td>", index)
    assert dict(counts[:4]) == {"done": "2", "failed": "1", "rejected": "1", "pending": "0"}
    assert float(counts[4][1]) > 0  # jobs per hour, from the timings
    assert "an owl at &lt;night&gt; &amp; &quot;day&quot;" in index  # the prompt escaped, not markup
    assert "NonFiniteLatents" in index and "width: 60 is not a multiple of 16" in index  # the reasons
    for fact in ("<dt>seed</dt>", "<dt>layout</dt><dd>single</dd>", "<dt>cache</dt><dd>none</dd>",
                 "<dt>approximation</dt><dd>exact</dd>", "<dt>size</dt><dd>64×48, 9 frames at 8 fps</dd>",
                 "<dt>steps</dt><dd>2</dd>", "denoise "):
        assert fact in index, fact
    assert index.count("<svg") == 2  # seconds per stage, busy time per rank
    numbers = json.loads((report_run.report / "report.json").read_text())
    assert numbers["counts"] == {"done": 2, "failed": 1, "rejected": 1, "pending": 0}


def test_previews_are_real_media_inside_the_report(report_run):
    page = _page(report_run.report / "index.html")
    local = [link for link in page.links if not link.startswith("../outputs/")]
    assert not [link for link in page.links if re.match(r"^[a-z]+:|^/|^//", link) and link != "data:,"]
    from urllib.parse import unquote

    for link in local + [link for link in page.links if link.startswith("../outputs/")]:
        if link != "data:,":
            assert (report_run.report / unquote(link)).is_file(), link  # nothing points at a missing file
    thumbs = sorted((report_run.report / "thumbs").iterdir())
    posters = sorted((report_run.report / "posters").iterdir())
    videos = sorted((report_run.report / "videos").iterdir())
    assert len(thumbs) == len(posters) == len(videos) == 1
    with Image.open(thumbs[0]) as image:
        assert image.format == "JPEG" and image.size == (64, 64)
    with Image.open(posters[0]) as image:
        assert image.format == "JPEG" and image.size == (64, 48)
    frames = decode_mp4(videos[0].read_bytes())
    assert frames.shape == (9, 48, 64, 3)  # the whole video, playable H.264
    assert videos[0].name.startswith("fox%20%231-")  # the id's name in the run, then the output's hash


def test_each_filter_lists_only_its_jobs(report_run):
    expected = {"done": {"owl", "fox #1"}, "failed": {"explodes"}, "rejected": {"bad-size"}}
    for status, ids in expected.items():
        cards = _page(report_run.report / f"{status}-all-1.html").cards
        assert {card["id"] for card in cards} == ids and {card["status"] for card in cards} == {status}
    models = {"m1": "tiny-flux", "m2": "tiny-wan"}  # keys in sorted order
    for key, model in models.items():
        cards = _page(report_run.report / f"all-{key}-1.html").cards
        assert cards and {card["model"] for card in cards} == {model}
    assert [card["id"] for card in _page(report_run.report / "failed-m1-1.html").cards] == []
    assert [card["id"] for card in _page(report_run.report / "done-m2-1.html").cards] == ["fox #1"]


def test_pages_hold_at_most_page_size_jobs_and_every_job_once(report_run, tmp_path):
    result = run_cli("report", str(report_run.out), "--to", str(tmp_path / "paged"), "--page-size", "3", "--json")
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)
    assert written["jobs"] == 4 and written["previews_made"] == 2  # a new folder: made there
    first, second = _page(tmp_path / "paged" / "index.html"), _page(tmp_path / "paged" / "all-all-2.html")
    assert len(first.cards) == 3 and len(second.cards) == 1
    assert sorted(card["id"] for card in first.cards + second.cards) == ["bad-size", "explodes", "fox #1", "owl"]
    assert "all-all-2.html" in first.links and "index.html" in second.links  # the pager
    assert not any(link.startswith("../outputs/") for link in first.links)  # --to elsewhere: no link out
    assert run_cli("report", str(report_run.out), "--page-size", "201").returncode == 2


def test_a_later_report_reuses_the_previews(report_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(report_run.out, out)
    again = json.loads(run_cli("report", str(out), "--json").stdout)
    assert (again["previews_made"], again["previews_reused"]) == (0, 2)
    poster = next((out / "report" / "posters").iterdir())
    poster.unlink()
    once_more = json.loads(run_cli("report", str(out), "--json").stdout)
    assert (once_more["previews_made"], once_more["previews_reused"]) == (1, 1)  # only what was missing
    assert poster.is_file()


def test_a_missing_output_is_said_on_its_card(report_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(report_run.out, out)
    shutil.rmtree(out / "report")
    (out / "outputs" / "owl.png").unlink()
    result = run_cli("report", str(out))
    assert result.returncode == 0, result.stderr
    assert "1 unavailable" in result.stdout
    assert "No preview: its output outputs/owl.png is missing from the run" in (out / "report" / "index.html").read_text()


def test_a_report_to_an_fsspec_url(report_run):
    url = "memory://genbatch-report-test/night"
    assert run_cli("report", str(report_run.out), "--to", url).returncode == 0
    fs = fsspec.filesystem("memory")
    assert "owl" in fs.cat_file("/genbatch-report-test/night/index.html").decode()
    assert len(fs.ls("/genbatch-report-test/night/videos")) == 1
    fs.rm("/genbatch-report-test", recursive=True)


def test_a_folder_without_a_run_is_a_usage_error(tmp_path):
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 2 and "holds no run" in result.stderr


def test_busy_time_counts_overlaps_once_and_shows_an_idle_rank():
    rows = [  # attempt a: rank 0 busy 0-10 (two overlapping rows), rank 1 busy 0-2; attempt b: rank 0 alone
        ("a", 0, 0.0, 6.0), ("a", 0, 4.0, 6.0), ("a", 1, 0.0, 1.0), ("a", 1, 1.0, 1.0), ("b", 0, 100.0, 5.0),
    ]
    timings = pa.table({"run_id": [r[0] for r in rows], "rank": [r[1] for r in rows],
                        "start": [r[2] for r in rows], "seconds": [r[3] for r in rows]})
    busy = {item.rank: item for item in rank_busy(timings)}
    assert (busy[0].busy_s, busy[0].span_s) == pytest.approx((15.0, 15.0))
    assert (busy[1].busy_s, busy[1].span_s) == pytest.approx((2.0, 10.0))  # idle 80% of attempt a
    assert busy[1].fraction == pytest.approx(0.2)
    assert rank_busy(pa.table({})) == []


def test_stage_seconds_are_over_done_jobs():
    jobs = [JobView(id="a", status="done", stages={"denoise": 2.0, "vae_decode": 1.0}),
            JobView(id="b", status="done", stages={"denoise": 4.0}),
            JobView(id="c", status="failed", stages={"denoise": 100.0})]
    assert stage_seconds(jobs) == {"denoise": (2, 6.0, 3.0), "vae_decode": (1, 1.0, 1.0)}


def test_a_run_on_s3_reports_onto_s3_and_reuses_its_previews(report_run, s3_run):
    from genbatch.report import ReportOptions, write_report

    fs = s3_run.endpoint.filesystem()
    for name in ("outputs", "done", "failed", "rejected", "results", "timings", "run.json"):
        fs.put(str(report_run.out / name), f"{s3_run.url}/{name}", recursive=True)
    options = ReportOptions(out=s3_run.url, storage_options=s3_run.storage_options)
    first = write_report(options)
    assert first.url == f"{s3_run.url}/report/index.html"
    assert (first.previews.made, first.previews.failed, first.jobs) == (2, 0, 4)
    index = fs.cat_file(f"{s3_run.url}/report/index.html").decode()
    assert index.count('<article class="job') == 4 and "NonFiniteLatents" in index
    assert len(fs.ls(f"{s3_run.url}/report/videos", refresh=True)) == 1
    again = write_report(options)
    assert (again.previews.made, again.previews.reused) == (0, 2)


def test_a_lora_set_reads_as_one_line():
    text = ('[{"uri":"org/fast@main","scale":0.8,"weight_name":"w.safetensors","sha256":"ab"},'
            '{"uri":"./style","scale":1.0,"expert":"low"}]')
    assert lora_label(text) == "org/fast@main (w.safetensors) x 0.8, ./style x 1 [low]"
    assert lora_label(None) is None and lora_label("not json") == "not json"
