"""genbatch.report: `gen report OUT`, a static HTML gallery of a run (layer 3: reads the run through io).

    write_report(ReportOptions(out=...))   write.py: the run -> OUT/report/index.html and its pages
    run_data.py    the results rows as JobViews, the run's info and timings
    stats.py       seconds per stage, each rank's busy time
    previews.py    thumbnails, posters, H.264 previews (Pillow, imageio-ffmpeg), made once
    pages.py       the HTML of the cards, the filters' pages, the pager; summary.py, charts.py, assets.py
    destination.py the report's folder on any fsspec URL
"""

from genbatch.report.config import MAX_PAGE_SIZE, ReportOptions
from genbatch.report.write import ReportResult, write_report

__all__ = ["MAX_PAGE_SIZE", "ReportOptions", "ReportResult", "write_report"]
