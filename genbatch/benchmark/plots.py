"""The report's PNG plots, drawn with matplotlib's Agg canvas chosen at call time (no pyplot, no global
backend switch: importing genbatch never touches matplotlib's state)."""

from __future__ import annotations

import io

from genbatch.benchmark.metrics import STAGES, LayoutMetrics


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def step_time_png(metrics: dict[str, LayoutMetrics], title: str) -> bytes:
    """Seconds of each denoising step (median over jobs), one line per layout."""
    figure = _figure(8, 4.5)
    axes = figure.add_subplot()
    for name, item in metrics.items():
        steps = range(len(item.step_seconds))
        axes.plot(steps, item.step_seconds, marker="o", label=f"{name} ({item.world}p)")
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("denoising step")
    axes.set_ylabel("seconds (slowest rank, median over jobs)")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)


def stage_breakdown_png(metrics: dict[str, LayoutMetrics], title: str) -> bytes:
    """Mean seconds per job by stage, one stacked bar per layout."""
    names = list(metrics)
    figure = _figure(8, 2.0 + 0.5 * len(names))
    axes = figure.add_subplot()
    left = [0.0] * len(names)
    for stage in STAGES:
        widths = [metrics[name].stage_seconds.get(stage, 0.0) for name in names]
        axes.barh(names, widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.invert_yaxis()
    axes.set_xlabel("seconds per job")
    axes.set_title(title)
    axes.grid(axis="x", alpha=0.3)
    figure.legend(loc="outside lower center", ncols=len(STAGES), fontsize="small")
    return _png(figure)


def quality_png(quality: dict[str, dict[str, float]], title: str) -> bytes:
    """PSNR (dB) and SSIM of each approximate configuration's outputs against the exact one's, one bar per
    layout in each of two panels (`quality`: layout -> {"psnr_db", "ssim", ...})."""
    names = list(quality)
    figure = _figure(8, 1.6 + 0.5 * len(names))
    psnr_axes, ssim_axes = figure.subplots(1, 2, sharey=True)
    for axes, metric, label in ((psnr_axes, "psnr_db", "PSNR dB (higher: closer)"),
                                (ssim_axes, "ssim", "SSIM (1: identical)")):
        values = [quality[name][metric] for name in names]
        axes.barh(names, values)
        for row, value in enumerate(values):
            axes.annotate(f"{value:.2f}" if metric == "psnr_db" else f"{value:.4f}", (value, row),
                          xytext=(3, 0), textcoords="offset points", va="center", fontsize="small")
        axes.set_xlabel(label)
        axes.grid(axis="x", alpha=0.3)
    ssim_axes.set_xlim(0, 1.1)
    psnr_axes.set_xlim(0, 1.15 * max(quality[name]["psnr_db"] for name in names))
    psnr_axes.invert_yaxis()
    figure.suptitle(title)
    return _png(figure)
