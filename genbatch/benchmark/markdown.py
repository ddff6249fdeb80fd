"""The report's Markdown: what ran, seconds per step and jobs per hour by layout, stages, bytes, the
comparison with the baseline, the outputs' quality against the exact configuration, and the plots."""

from __future__ import annotations

from genbatch.benchmark.compare import Comparison, format_change
from genbatch.benchmark.metrics import STAGES, LayoutMetrics

STEP_PLOT = "plots/step_time.png"
STAGE_PLOT = "plots/stages.png"
QUALITY_PLOT = "plots/quality.png"


def scored_layouts(metrics: dict[str, LayoutMetrics]) -> dict[str, dict]:
    """The layouts whose outputs were scored against the exact configuration's, with their scores."""
    return {name: m.extra for name, m in metrics.items() if "psnr_db" in m.extra}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _optional(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def render(info: dict, metrics: dict[str, LayoutMetrics], comparison: Comparison | None,
           failures: dict[str, str]) -> str:
    """The whole report. `info` holds suite, model, manifest, machine and versions; `failures` maps a failed
    layout to the end of its output."""
    manifest = info["manifest"]
    frames = f", {manifest['num_frames']} frames" if manifest.get("num_frames") else ""
    lines = [
        f"# genbatch benchmark: suite `{info['suite']}`",
        "",
        f"- when: {info['created']}  ",
        f"- model: `{info['model']}` ({info['model_detail']})  ",
        f"- work: {manifest['jobs']} jobs of {manifest['width']}x{manifest['height']}{frames}, "
        f"{manifest['num_inference_steps']} steps, guidance {manifest['guidance_scale']}, dtype {info['dtype']}"
        + (f", batches of {info['batch_size']} rows" if info.get("batch_size", 1) != 1 else "")
        + (f", step cache {info['cache']}" if info.get("cache", "none") != "none" else "")
        + (f", quantized weights {info['quantization']}" if info.get("quantization", "none") != "none" else "")
        + "  ",
        *([f"- recipe: {info['recipe']}  "] if info.get("recipe") else []),
        f"- machine: {info['host']}, {info['cpus']} CPUs, {info['accelerators']}, load average "
        f"{info['load_average']:.2f} at the end (other work on the machine slows every layout)  ",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in info["versions"].items()),
        "",
        "Seconds per step: median over jobs and steps of the slowest rank of the job's group. Jobs per hour: "
        "jobs over the span from the first job's first stage to the last write (start-up and model loading "
        "excluded; they are in the wall seconds). Efficiency: jobs per hour over processes x jobs per hour of "
        "`single`.",
        "",
        "## Throughput by layout",
        "",
    ]
    lines += _table(
        ["layout", "processes", "s/step", "step speedup", "jobs/hour", "efficiency", "wall s"],
        [[name, str(m.world), f"{m.seconds_per_step:.4f}", _optional(m.step_speedup, "{:.2f}x"),
          f"{m.jobs_per_hour:.1f}", _optional(m.efficiency, "{:.0%}"), _optional(m.extra.get("wall_seconds"), "{:.1f}")]
         for name, m in metrics.items()],
    )
    lines += ["## Seconds per job by stage", ""]
    lines += _table(["layout", *STAGES],
                    [[name, *(_optional(m.stage_seconds.get(stage), "{:.3f}") for stage in STAGES)]
                     for name, m in metrics.items()])
    lines += ["## Communication and memory", ""]
    lines += _table(["layout", "MiB sent per step per rank", "VAE decode peak MiB (largest rank)"],
                    [[name, _mib(m.bytes_per_step), _mib(m.peak_decode_bytes)] for name, m in metrics.items()])
    scored = scored_layouts(metrics)
    if scored and info.get("recipe"):
        lines += ["## Quality against the base model's full-step output", "",
                  "Outputs against those of one run of the base model (no LoRA, the suite's own steps and "
                  "guidance, no `--cache`) of the same seeds: mean PSNR and SSIM over the jobs. The distilled LoRA "
                  "is a different model, not a cache: these say how far its outputs are from the base model's. A "
                  "PSNR drop of more than 1 dB against the baseline is a regression.", ""]
    elif scored:
        lines += ["## Quality against the exact configuration", "",
                  "Outputs against those of one exact run (no `--cache`, no `--quantization`: the weights in the "
                  "run's dtype) of the same seeds: mean PSNR (identical outputs count as 100 dB) and SSIM over the "
                  "jobs; `against` says what each layout's outputs approximate the exact ones by. A PSNR drop of "
                  "more than 1 dB against the baseline is a regression.", ""]
    if scored:
        lines += _table(["layout", "PSNR dB", "SSIM", "jobs", "against"],
                        [[name, f"{q['psnr_db']:.2f}", f"{q['ssim']:.4f}", str(q["jobs"]), q.get("approximation") or "-"]
                         for name, q in scored.items()])
    if info.get("galleries"):
        lines += ["## Galleries", "", "Each layout's outputs, settings and seconds per stage (`gen report` of its run):",
                  "", *(f"- [{name}]({link})" for name, link in info["galleries"].items()), ""]
    if comparison is not None:
        lines += _comparison(comparison)
    if failures:
        lines += ["## Failed layouts", ""]
        for name, tail in failures.items():
            lines += [f"### {name}", "", "```", tail.strip()[-2000:], "```", ""]
    if metrics:
        lines += ["## Plots", "", f"![seconds per denoising step by layout]({STEP_PLOT})", "",
                  f"![seconds per job by stage and layout]({STAGE_PLOT})", ""]
        if scored:
            against = "the base model's full-step output" if info.get("recipe") else "the exact configuration"
            lines += [f"![PSNR and SSIM against {against} by layout]({QUALITY_PLOT})", ""]
    return "\n".join(lines)


def _comparison(comparison: Comparison) -> list[str]:
    count = len(comparison.regressions)
    verdict = (f"**{count} regression{'s' if count != 1 else ''}** beyond {comparison.threshold:.0%}" if count
               else f"**no regression** beyond {comparison.threshold:.0%}")
    lines = ["## Against the baseline", "", f"Baseline: `{comparison.baseline_url}`. Verdict: {verdict}.", ""]
    lines += _table(
        ["layout", "metric", "baseline", "tonight", "change", ""],
        [[c.layout, c.metric, f"{c.baseline:.4g}", f"{c.current:.4g}", format_change(c),
          "REGRESSION" if c.regression else ("better" if c.better else "")] for c in comparison.changes],
    )
    one_side = (("Not in the baseline", comparison.only_current), ("Not run tonight", comparison.only_baseline))
    for label, names in one_side:
        if names:
            lines += [f"{label}: {', '.join(names)}.", ""]
    return lines
