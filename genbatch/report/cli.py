"""`gen report OUT`: argument handling only."""

from __future__ import annotations

import click

from genbatch.jobs.counts import counted
from genbatch.manifests.cli import read_or_exit, storage_options_from
from genbatch.report.config import MAX_PAGE_SIZE


@click.command("report", short_help="Write a static HTML gallery of a run (OUT/report/index.html).")
@click.argument("out")
@click.option("--to", metavar="DIR|URL",
              help="Where the report goes: a folder or any fsspec URL [default: OUT/report].")
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=MAX_PAGE_SIZE, show_default=True,
              help="Jobs per page.")
@click.option("--thumb-px", type=click.IntRange(min=16), default=256, show_default=True,
              help="The longest side of thumbnails and posters, in pixels.")
@click.option("--preview-px", type=click.IntRange(min=16), default=320, show_default=True,
              help="The most pixels a video's H.264 preview is wide.")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Threads reading outputs and making previews.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for OUT and the report's URL (repeatable).")
@click.option("--storage-timeout", type=click.FloatRange(min=0, min_open=True), default=120, show_default=True,
              metavar="SECONDS", help="How long one read or write may keep failing before the command gives up "
              "(exit 75).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def report_command(out: str, to: str | None, page_size: int, thumb_px: int, preview_px: int, workers: int,
                   storage_option: tuple[str, ...], storage_timeout: float, as_json: bool) -> None:
    """Write a static HTML gallery of the run in OUT (a path or any fsspec URL).

    \b
    Pages:    index.html: done / failed / rejected / pending counts, jobs per hour, seconds per stage and
              each rank's busy time, drawn; then every job, 200 a page: a thumbnail, or a video's poster and
              an H.264 preview that plays, its prompt, seed, model, sizes, steps, layout, LoRA, cache mode,
              approximation and seconds per stage; failed and rejected rows with their reasons. The status
              and model menus open pages holding only those jobs.
    Files:    REPORT/index.html, REPORT/<status>-<model>-<page>.html, REPORT/report.css, REPORT/report.json,
              REPORT/thumbs/, posters/, videos/: made once per output and reused by a later report of the run.
              Nothing is fetched from outside REPORT: open index.html from disk, or serve the folder.
    Exit:     0 written, 2 OUT holds no run (or storage refuses for good), 75 storage down past --storage-timeout.
    \b
    Example:  gen report runs/night --to /srv/www/night && xdg-open /srv/www/night/index.html
    """
    from genbatch.report.config import ReportOptions
    from genbatch.report.write import write_report

    def write():
        return write_report(ReportOptions(out=out, to=to, page_size=page_size, thumb_px=thumb_px,
                                          preview_px=preview_px, workers=workers,
                                          storage_options=storage_options_from(storage_option),
                                          storage_timeout=storage_timeout))

    result = read_or_exit(write)  # a bad option's ValueError too: exit 2 naming it
    if as_json:
        import json

        click.echo(json.dumps({"url": result.url, "jobs": result.jobs, "pages": result.pages, "counts": result.counts,
                               "jobs_per_hour": result.jobs_per_hour, "previews_made": result.previews.made,
                               "previews_reused": result.previews.reused, "previews_failed": result.previews.failed,
                               "seconds": round(result.seconds, 3)}))
    else:
        click.echo(describe(result))


def describe(result) -> str:
    """One line saying what a report holds and where it is."""
    previews = result.previews
    unavailable = f", {previews.failed} unavailable" if previews.failed else ""
    return (f"genbatch: report of {counted(result.jobs, 'job')} on {counted(result.pages, 'page')} (previews: {previews.made} made, "
            f"{previews.reused} reused{unavailable}) in {result.seconds:.1f} s -> {result.url}")
