"""`gen report OUT`: read the run, make the previews that are missing, write the pages.

    result = write_report(ReportOptions(out="s3://bucket/run"))    # -> s3://bucket/run/report/index.html

    OUT/report/index.html               the summary and the first page of every job
    OUT/report/<status>-<model>-<n>.html   the other pages of each filter (pages.py)
    OUT/report/report.css, report.json  the stylesheet; the summary's numbers, for scripts
    OUT/report/thumbs/ posters/ videos/ the previews (previews.py), reused by later reports of the run

index.html is written last, so a reader never follows it to a page not yet written.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from genbatch.io.layout import encode_id
from genbatch.io.throughput import throughput
from genbatch.report.assets import CSS
from genbatch.report.config import ReportOptions
from genbatch.report.destination import Destination
from genbatch.report.pages import ALL, card, listings, model_keys, page_name, render_page
from genbatch.report.previews import Previews, make_previews
from genbatch.report.run_data import STATUSES, load_run
from genbatch.report.stats import rank_busy, stage_seconds
from genbatch.report.summary import summary_html


@dataclass(kw_only=True, slots=True)
class ReportResult:
    """What write_report wrote."""

    url: str
    """The report's index.html."""
    jobs: int
    """Jobs listed (done, failed and rejected rows)."""
    pages: int
    """HTML pages written, over every filter."""
    previews: Previews
    """The previews made, reused and unavailable."""
    counts: dict
    """done / failed / rejected / pending (None when the manifest cannot be read)."""
    jobs_per_hour: float | None
    seconds: float
    """Wall time of the whole report."""


def write_report(options: ReportOptions) -> ReportResult:
    """Write the report of the run in `options.out` to `options.destination`; a folder holding no run raises
    FileNotFoundError, a store down past `storage_timeout` StorageError."""
    from genbatch.io import RetryPolicy, RunStore

    started = time.perf_counter()
    store = RunStore(options.out, storage_options=options.storage_options,
                     retry=RetryPolicy(timeout_s=options.storage_timeout))
    data = load_run(store, options.storage_options)
    destination = Destination(options.destination, options.storage_options, timeout_s=options.storage_timeout)
    previews = make_previews(data.jobs, store, destination, thumb_px=options.thumb_px,
                             preview_px=options.preview_px, workers=options.workers)
    counts, rate = data.counts(), throughput(data.timings)
    summary = summary_html(counts=counts, jobs_per_hour=rate, info=data.info, stages=stage_seconds(data.jobs),
                           ranks=rank_busy(data.timings), previews=previews)
    beside_run = options.to is None  # OUT/report: the full outputs are at ../outputs/
    cards = [card(job, previews.media.get(job.id),
                  f"../outputs/{encode_id(job.id)}.{job.output_ext}" if beside_run and job.output_ext else None)
             for job in data.jobs]
    keys = model_keys(data.models())
    menu_counts = {ALL: len(data.jobs), **{status: counts[status] for status in STATUSES}}
    title = f"genbatch run {store.url.rstrip('/').rsplit('/', 1)[-1]}"
    files: dict[str, str] = {}
    for status, key, indices in listings(data.jobs, keys):
        pages = max(1, math.ceil(len(indices) / options.page_size))
        for page in range(1, pages + 1):
            chosen = indices[(page - 1) * options.page_size: page * options.page_size]
            files[page_name(status, key, page)] = render_page(
                title=title, run_url=store.url, status=status, model_key=key, page=page, pages=pages,
                cards=[cards[index] for index in chosen], keys=keys, counts=menu_counts,
                summary=summary if (status, key, page) == (ALL, ALL, 1) else "")
    index = files.pop("index.html")
    numbers = {"run": store.url, "counts": counts, "jobs_per_hour": rate, "jobs": len(data.jobs),
               "pages": len(files) + 1, "previews": {"made": previews.made, "reused": previews.reused,
                                                     "failed": previews.failed}}
    bodies = [("report.css", CSS.encode()), ("report.json", json.dumps(numbers, indent=1).encode()),
              *((name, text.encode()) for name, text in files.items())]
    with ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="genbatch-report") as pool:
        list(pool.map(lambda item: destination.write(*item), bodies))
    destination.write("index.html", index.encode())
    return ReportResult(url=f"{destination.url}/index.html", jobs=len(data.jobs), pages=len(files) + 1,
                        previews=previews, counts=counts, jobs_per_hour=rate,
                        seconds=time.perf_counter() - started)
