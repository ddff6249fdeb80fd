"""The report's stylesheet and its one small script: plain CSS, plain JavaScript, nothing fetched.

The script only turns the two filter menus into a page name, `page_name` of pages.py spelled again:
`index.html` for every status and model, else `<status>-<model key>-<page>.html`.
"""

CSS = """
:root { --fg: #1d2430; --muted: #5b6675; --line: #d8dde5; --done: #1f7a3a; --failed: #b3261e; --rejected: #8a5a00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0 24px 48px; }
header { display: flex; flex-wrap: wrap; gap: 12px 24px; align-items: baseline; border-bottom: 1px solid var(--line);
         padding: 14px 0 10px; }
header h1 { font-size: 18px; margin: 0; }
header .run { color: var(--muted); word-break: break-all; }
form.filters { display: flex; gap: 14px; align-items: center; margin: 12px 0; }
nav.pages { margin: 12px 0; display: flex; flex-wrap: wrap; gap: 6px; align-items: center; }
nav.pages a, nav.pages span { padding: 2px 8px; border: 1px solid var(--line); border-radius: 4px; text-decoration: none; }
nav.pages .current { background: var(--fg); color: #fff; }
section.summary { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 12px 32px; margin: 16px 0; }
table.counts td, table.counts th, table.facts td, table.facts th { padding: 2px 12px 2px 0; text-align: left; }
table.counts td { font-variant-numeric: tabular-nums; }
svg.chart { width: 100%; max-width: 560px; height: auto; }
svg.chart text { font: 12px system-ui, sans-serif; fill: var(--fg); }
svg.chart text.title { font-weight: 600; }
svg.chart rect { fill: #4b7bd0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(280px, 1fr)); gap: 14px; }
article.job { border: 1px solid var(--line); border-radius: 6px; padding: 10px; overflow: hidden; }
article.job.failed { border-color: var(--failed); } article.job.rejected { border-color: var(--rejected); }
article.job h3 { font-size: 14px; margin: 6px 0 4px; word-break: break-all; }
.media img, .media video { display: block; width: 100%; height: 220px; object-fit: contain; background: #eef1f5; }
.badge { font-size: 11px; color: #fff; padding: 1px 6px; border-radius: 8px; margin-right: 6px; }
.badge.done { background: var(--done); } .badge.failed { background: var(--failed); }
.badge.rejected { background: var(--rejected); }
.prompt { margin: 4px 0; display: -webkit-box; -webkit-line-clamp: 4; -webkit-box-orient: vertical; overflow: hidden; }
.negative-prompt { margin: 4px 0; font-size: 12px; display: -webkit-box; -webkit-line-clamp: 2;
  -webkit-box-orient: vertical; overflow: hidden; } .negative-prompt .label { color: var(--muted); }
dl.facts { display: grid; grid-template-columns: auto 1fr; gap: 0 10px; margin: 6px 0; font-size: 12px; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; word-break: break-all; }
.stages { font-size: 12px; color: var(--muted); margin: 4px 0 0; }
.error { white-space: pre-wrap; color: var(--failed); font-size: 12px; margin: 6px 0 0; }
.problem { color: var(--muted); font-style: italic; }
.empty { color: var(--muted); }
"""

FILTER_SCRIPT = """
(function () {
  var form = document.getElementById("filters");
  form.addEventListener("change", function () {
    var status = form.elements.status.value, model = form.elements.model.value;
    window.location.href = (status === "all" && model === "all") ? "index.html"
      : status + "-" + model + "-1.html";
  });
})();
"""
