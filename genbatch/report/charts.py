"""Horizontal bar charts as inline SVG: no image file, no script, drawn by the browser itself.

    bars_svg([("denoise", 12.5, "12.5 s"), ...], title="Mean seconds per job by stage")
"""

from __future__ import annotations

from html import escape

_ROW_PX, _LABEL_PX, _BAR_PX, _VALUE_PX = 22, 130, 240, 150


def bars_svg(items: list[tuple[str, float, str]], *, title: str, scale: float | None = None) -> str:
    """One bar per (label, value, text) item, `text` written after the bar; bars are drawn against `scale`
    (the largest value when None). An empty list gives a line saying there is nothing to draw."""
    if not items:
        return f'<p class="empty">{escape(title)}: nothing timed yet.</p>'
    top = scale if scale is not None else max(value for _, value, _ in items)
    top = top if top > 0 else 1.0
    height = _ROW_PX * len(items) + 28
    width = _LABEL_PX + _BAR_PX + _VALUE_PX
    parts = [f'<svg class="chart" role="img" aria-label="{escape(title)}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="0" y="14" class="title">{escape(title)}</text>']
    for index, (label, value, text) in enumerate(items):
        y = 24 + index * _ROW_PX
        length = max(0.0, min(1.0, value / top)) * _BAR_PX
        parts.append(f'<text x="{_LABEL_PX - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
                     f'<rect x="{_LABEL_PX}" y="{y + 3}" width="{length:.1f}" height="{_ROW_PX - 6}"/>'
                     f'<text x="{_LABEL_PX + length + 6:.1f}" y="{y + 14}">{escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)
