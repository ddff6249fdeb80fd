"""Write a report to OUT (any fsspec URL):

    OUT/timings.parquet    every timing row of every layout, with `layout` and `world` columns
    OUT/summary.json       what ran, the metrics by layout, the comparison (if any), failed layouts
    OUT/report.md          the Markdown summary
    OUT/plots/step_time.png, OUT/plots/stages.png
    OUT/plots/quality.png  with an approximate --cache: each layout's PSNR and SSIM against the exact run's
    OUT/manifest.parquet, OUT/runs/<layout>/   (written before, by the suite's runs)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time

import pyarrow as pa

from genbatch.benchmark.compare import Comparison
from genbatch.benchmark.markdown import QUALITY_PLOT, STAGE_PLOT, STEP_PLOT, render, scored_layouts
from genbatch.benchmark.metrics import LayoutMetrics
from genbatch.benchmark.plots import quality_png, stage_breakdown_png, step_time_png


def machine_info(*, suite, model_dir: str, dtype: str | None) -> dict:
    """The header facts of a report: suite, model, work, machine, versions."""
    import diffusers
    import torch
    import transformers

    from genbatch import __version__

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    accelerators = f"{devices} x {torch.cuda.get_device_name(0)}" if devices else "no GPU"
    rows = suite.manifest_rows()
    manifest = {key: rows[0].get(key)  # no num_frames for an image model
                for key in ("width", "height", "num_frames", "num_inference_steps", "guidance_scale")}
    return {
        "suite": suite.name,
        "model": suite.model.name,
        "model_detail": suite.model.description,
        "model_dir": model_dir,
        "manifest": {"jobs": len(rows), **manifest},
        "dtype": dtype or ("bf16" if devices else "fp32"),
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "accelerators": accelerators,
        "versions": {"genbatch": __version__, "torch": torch.__version__, "diffusers": diffusers.__version__,
                     "transformers": transformers.__version__},
    }


def write_report(out: str, *, timings: pa.Table, metrics: dict[str, LayoutMetrics], info: dict,
                 comparison: Comparison | None, failures: dict[str, str], storage_options: dict | None = None) -> str:
    """Write the report files; returns the report.md URL."""
    from genbatch.io.options import open_filesystem
    from genbatch.io.tables import to_parquet_bytes

    fs, root, url = open_filesystem(out, storage_options)
    files = {
        "timings.parquet": to_parquet_bytes(timings),
        "summary.json": json.dumps(_summary(info, metrics, comparison, failures), indent=1, default=str).encode(),
        "report.md": render(info, metrics, comparison, failures).encode(),
    }
    if metrics:
        title = f"suite {info['suite']}: {info['model']}"
        files[STEP_PLOT] = step_time_png(metrics, f"Seconds per denoising step ({title})")
        files[STAGE_PLOT] = stage_breakdown_png(metrics, f"Seconds per job by stage ({title})")
        scored = scored_layouts(metrics)
        if scored:
            approximations = "; ".join(dict.fromkeys(q.get("approximation") or "-" for q in scored.values()))
            files[QUALITY_PLOT] = quality_png(scored, f"{approximations} against the exact configuration ({title})")
    for name, body in files.items():
        path = f"{root}/{name}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, body)
    return f"{url}/report.md"


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def _summary(info: dict, metrics: dict[str, LayoutMetrics], comparison: Comparison | None, failures: dict) -> dict:
    summary = {**info, "layouts": {name: dataclasses.asdict(item) for name, item in metrics.items()},
               "failed_layouts": sorted(failures)}
    if comparison is not None:
        summary["comparison"] = {
            "baseline": comparison.baseline_url,
            "threshold": comparison.threshold,
            "regressions": len(comparison.regressions),
            "changes": [{**dataclasses.asdict(change), "relative": _finite(change.relative)}
                        for change in comparison.changes],
        }
    return summary
