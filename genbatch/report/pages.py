"""The gallery's HTML pages: one listing per (status, model) filter, cut into pages of at most 200 jobs.

    page_name("all", "all", 1)      index.html     (the summary, then the first page of every job)
    page_name("failed", "m2", 3)    failed-m2-3.html

Each job's card is rendered once and put on the pages of each listing it belongs to (every status and its own,
every model and its own), so a filter chosen in the menus opens a page holding only those jobs, and no page
needs a script to hide rows. The menus' script (assets.FILTER_SCRIPT) only names the page to open.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from urllib.parse import quote

from genbatch.report.assets import FILTER_SCRIPT
from genbatch.report.run_data import STATUSES

ALL = "all"


def page_name(status: str, model_key: str, page: int) -> str:
    """The file of page `page` (from 1) of the listing of `status` and `model_key` (`all` for either)."""
    if status == ALL and model_key == ALL and page == 1:
        return "index.html"
    return f"{status}-{model_key}-{page}.html"


def model_keys(models: list[str]) -> dict[str, str]:
    """Per model, the short key its pages are named by (m1, m2, ... in sorted order)."""
    return {model: f"m{index}" for index, model in enumerate(sorted(models), start=1)}


def _number(value, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _href(path: str) -> str:
    return quote(path, safe="/")


def _size(job) -> str | None:
    if job.width is None or job.height is None:
        return None
    size = f"{job.width}×{job.height}"
    if job.num_frames:
        size += f", {job.num_frames} frames" + (f" at {job.fps} fps" if job.fps else "")
    return size


def _sound(job) -> str | None:
    """`16000 Hz, 0.33 s` for a video with a sound track, None for a silent output."""
    if not job.has_sound:
        return None
    return f"{job.audio_sample_rate} Hz" + (f", {job.audio_seconds:.3g} s" if job.audio_seconds else "")


def _media(job, media, original: str | None) -> str:
    if media is None:
        return ""
    if media.problem:
        return f'<p class="problem">No preview: {escape(media.problem)}</p>'
    alt = escape(job.prompt or job.id, quote=True)
    if media.video:
        # a video with sound plays it (not muted); a silent one stays muted
        body = (f'<video controls{"" if media.sound else " muted"} loop playsinline preload="metadata" '
                f'poster="{_href(media.thumb)}" src="{_href(media.video)}" aria-label="{alt}"></video>')
    else:
        body = f'<img src="{_href(media.thumb)}" alt="{alt}">'
    link = f'<a class="original" href="{_href(original)}">full output</a>' if original else ""
    return f'<div class="media">{body}</div>{link}'


def card(job, media=None, original: str | None = None) -> str:
    """One job's card: its preview (`media`: previews.Media), prompt, negative prompt (when the row had one),
    settings, seconds per stage, error."""
    facts = [("seed", job.seed), ("model", job.model), ("size", _size(job)), ("steps", job.steps),
             ("guidance", job.guidance), ("layout", job.layout), ("LoRA", job.lora), ("cache", job.cache),
             ("approximation", job.approximation), ("VAE decode", job.vae_decode), ("sound", _sound(job)),
             ("row", job.row)]
    listed = "".join(f"<dt>{name}</dt><dd>{escape(_number(value))}</dd>" for name, value in facts
                     if value is not None)
    stages = " · ".join(f"{escape(stage)} {seconds:.3g} s" for stage, seconds in job.stages.items())
    prompt = f'<p class="prompt" title="{escape(job.prompt, quote=True)}">{escape(job.prompt)}</p>' if job.prompt else ""
    if job.negative_prompt:
        prompt += (f'<p class="negative-prompt" title="{escape(job.negative_prompt, quote=True)}">'
                   f'<span class="label">negative:</span> {escape(job.negative_prompt)}</p>')
    error = f'<p class="error">{escape(job.error)}</p>' if job.error and job.status != "done" else ""
    return (f'<article class="job {job.status}" data-status="{job.status}" '
            f'data-model="{escape(job.model or "", quote=True)}">'
            f'{_media(job, media, original)}'
            f'<h3><span class="badge {job.status}">{job.status}</span>{escape(job.id)}</h3>{prompt}'
            f'<dl class="facts">{listed}</dl>'
            + (f'<p class="stages">{stages}</p>' if stages else "") + f"{error}</article>")


def listings(jobs, keys: dict[str, str]) -> Iterator[tuple[str, str, list[int]]]:
    """(status, model key, indices of its jobs) for every filter: each status and `all`, by each model and
    `all` (the model filters only when the run has more than one model)."""
    by_filter: dict[tuple[str, str], list[int]] = {(status, key): [] for status in (ALL, *STATUSES)
                                                   for key in (ALL, *(keys.values() if len(keys) > 1 else ()))}
    for index, job in enumerate(jobs):
        key = keys.get(job.model) if len(keys) > 1 else None
        for status in (ALL, job.status):
            by_filter[(status, ALL)].append(index)
            if key is not None:
                by_filter[(status, key)].append(index)
    for (status, key), indices in by_filter.items():
        yield status, key, indices


def _filters(status: str, model_key: str, keys: dict[str, str], counts: dict[str, int]) -> str:
    options = "".join(f'<option value="{value}"{" selected" if value == status else ""}>{value}'
                      f'{f" ({counts[value]})" if value in counts else ""}</option>' for value in (ALL, *STATUSES))
    models = "".join(f'<option value="{key}"{" selected" if key == model_key else ""}>{escape(model)}</option>'
                     for model, key in keys.items()) if len(keys) > 1 else ""
    model_menu = (f'<label>model <select name="model"><option value="all"'
                  f'{" selected" if model_key == ALL else ""}>all</option>{models}</select></label>'
                  if models else '<input type="hidden" name="model" value="all">')
    return (f'<form class="filters" id="filters"><label>status <select name="status">{options}</select></label>'
            f"{model_menu}</form><script>{FILTER_SCRIPT}</script>")


def _pager(status: str, model_key: str, page: int, pages: int) -> str:
    if pages <= 1:
        return ""
    shown = sorted({1, pages, *range(max(1, page - 3), min(pages, page + 3) + 1)})
    links, last = [], 0
    for number in shown:
        if number > last + 1:
            links.append("<span>…</span>")
        links.append(f'<span class="current">{number}</span>' if number == page
                     else f'<a href="{page_name(status, model_key, number)}">{number}</a>')
        last = number
    return f'<nav class="pages">page {page} of {pages}: {"".join(links)}</nav>'


def render_page(*, title: str, run_url: str, status: str, model_key: str, page: int, pages: int,
                cards: list[str], keys: dict[str, str], counts: dict[str, int], summary: str = "") -> str:
    """A whole page: header, the summary (index.html only), filter menus, pager, the cards."""
    pager = _pager(status, model_key, page, pages)
    grid = f'<div class="grid">{"".join(cards)}</div>' if cards else '<p class="empty">No jobs here.</p>'
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,"><link rel="stylesheet" href="report.css"></head><body>'
            f'<header><h1><a href="index.html">{escape(title)}</a></h1><span class="run">{escape(run_url)}</span>'
            f"</header>{summary}{_filters(status, model_key, keys, counts)}{pager}{grid}{pager}</body></html>\n")
