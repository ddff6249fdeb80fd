"""The summary at the top of index.html: counts, jobs per hour, the run's facts, and two charts."""

from __future__ import annotations

import datetime as _dt
from html import escape

from genbatch.report.charts import bars_svg


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    return f"{value / 60:.1f} min" if value >= 600 else f"{value:.3g} s"


def _when(stamp) -> str | None:
    if not isinstance(stamp, (int, float)):
        return None
    return _dt.datetime.fromtimestamp(stamp, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def summary_html(*, counts: dict, jobs_per_hour: float | None, info: dict | None, stages: dict,
                 ranks: list, previews) -> str:
    """The summary section (`stages`: stats.stage_seconds; `ranks`: stats.rank_busy; `previews`: Previews)."""
    rows = "".join(f"<tr><th>{name}</th><td>{'?' if value is None else value}</td></tr>"
                   for name, value in counts.items())
    rate = "-" if jobs_per_hour is None else f"{jobs_per_hour:.1f}"
    info = info or {}
    facts = [("manifest", info.get("manifest")), ("layout", info.get("layout")), ("mesh", info.get("mesh")),
             ("world size", info.get("world_size")), ("device", info.get("device")), ("dtype", info.get("dtype")),
             ("host", info.get("host")), ("last attempt", info.get("attempt")),
             ("started", _when(info.get("started"))), ("ended", _when(info.get("ended")))]
    fact_rows = "".join(f"<tr><th>{name}</th><td>{escape(str(value))}</td></tr>" for name, value in facts
                        if value is not None)
    media = (f"<p>Previews: {previews.made} made now, {previews.reused} reused"
             + (f", {previews.failed} unavailable" if previews.failed else "") + ".</p>")
    stage_chart = bars_svg([(stage, mean, f"{mean:.3g} s ({jobs} jobs)") for stage, (jobs, _, mean) in stages.items()],
                           title="Mean seconds per done job, by stage")
    rank_chart = bars_svg([(f"rank {item.rank}", item.fraction, f"{item.fraction:.0%} of {_seconds(item.span_s)}")
                           for item in ranks], title="Busy time per rank (share of its attempts' span)", scale=1.0)
    return (f'<section class="summary" id="summary"><div><table class="counts">{rows}'
            f"<tr><th>jobs per hour</th><td>{rate}</td></tr></table>{media}</div>"
            f'<div><table class="facts">{fact_rows}</table></div>'
            f"<div>{stage_chart}</div><div>{rank_chart}</div></section>")
