"""`gen bench`, end to end: build the suite's model, write its manifest, run every layout, write the report,
compare with the baseline, and decide the exit status.

    0  every layout ran, no regression beyond the threshold
    1  a layout failed (its jobs failed or its processes died); the report says which and why
    2  usage: unknown suite or layout, OUT already holds a report, unreadable baseline
    3  a regression beyond the threshold against the baseline
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from genbatch.benchmark.recipe import FewStepRecipe
from genbatch.jobs import exit_codes
from genbatch.jobs.counts import counted

REGRESSION = 3
"""Exit status when a metric got worse than the baseline by more than the threshold."""


class BenchUsageError(ValueError):
    """Options that cannot run; nothing was started (exit status 2)."""


@dataclass(kw_only=True, slots=True)
class BenchOptions:
    out: str
    """Where the report goes (a path or any fsspec URL)."""
    suite: str = "cpu"
    """`tiny`, `cpu` or `gpu` (see `genbatch.benchmark.suites`)."""
    layouts: str | None = None
    """Comma-separated layout names to run instead of the suite's (e.g. `single,dp2`)."""
    baseline: str | None = None
    """A previous report's folder to compare with."""
    threshold: float = 0.05
    """A metric worse than the baseline by more than this fraction is a regression."""
    model_cache: str | None = None
    """Where built benchmark models are kept (default: `genbatch.benchmark.models.default_cache_dir()`)."""
    dtype: str | None = None
    """fp32 / bf16 / fp16 for the runs (None: bf16 on GPUs, fp32 on CPUs)."""
    storage_args: tuple[str, ...] = ()
    """`KEY=VALUE` fsspec options for OUT and the baseline (passed on to `gen run`)."""
    overwrite: bool = False
    """Replace a report already in OUT (else OUT must not hold one)."""
    run_args: tuple[str, ...] = ()
    """More `gen run` arguments for every layout (`--compile`, `--attention`: `genbatch.parallel.flags.kernel_args`)."""
    stale_args: tuple[str, ...] = ()
    """`gen run` arguments for the stale-K/V layouts only (`--warmup-steps W`, `--patches M`)."""
    recipe: FewStepRecipe | None = None
    """A few-step night: every layout runs this distilled LoRA at its steps, scored against the base model."""
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))
    """Where progress and the comparison are printed."""


def _prepare(options: BenchOptions):
    """Everything checked before anything runs: the suite, its layouts, OUT, the baseline."""
    from genbatch.benchmark.compare import load_baseline
    from genbatch.benchmark.layouts import parse_layouts
    from genbatch.benchmark.suites import get_suite
    from genbatch.io import parse_storage_options
    from genbatch.io.options import open_filesystem

    try:
        if not 0 <= options.threshold < 1:
            raise ValueError(f"--threshold {options.threshold} must be a fraction in [0, 1), e.g. 0.05 for 5%")
        storage = parse_storage_options(list(options.storage_args))
        suite = get_suite(options.suite)
        layouts = parse_layouts(options.layouts) if options.layouts else suite.layouts_here()
        baseline = load_baseline(options.baseline, storage) if options.baseline else None
        fs, root, _ = open_filesystem(options.out, storage)
    except (ValueError, FileNotFoundError) as error:
        raise BenchUsageError(str(error)) from None
    for name in ("report.md", "runs", "timings.parquet"):
        if fs.exists(f"{root}/{name}"):
            if not options.overwrite:
                raise BenchUsageError(f"{options.out} already holds a report ({name}); pass a new --out "
                                      "(e.g. one folder per night) or --overwrite to replace it")
            fs.rm(f"{root}/{name}", recursive=True)
    return suite, layouts, baseline, storage


BASE_MANIFEST = "base-manifest.parquet"
"""A few-step night's reference manifest in OUT: the suite's own rows (its steps and guidance)."""


def _quality(options: BenchOptions, runner, layouts, runs: dict, metrics: dict, failures: dict, storage) -> dict:
    """With an approximate configuration (a `--cache` mode, quantized weights, or layouts on stale K/V:
    PipeFusion, DistriFusion) or another model (a few-step recipe's LoRA): one exact run (same seeds) under
    OUT/exact, of the first exact layout (one process when every layout is stale), unquantized, of the base
    model at the suite's own steps for a recipe, and each approximate layout's PSNR / SSIM against it, in its
    metrics (with what it approximates: `approximation`) and OUT/quality.json. {} when nothing is
    approximate."""
    import json
    from dataclasses import replace

    from genbatch.benchmark.layouts import layout_name, stale
    from genbatch.benchmark.quality import cache_mode, output_quality, quantization_of, without_cache
    from genbatch.io.options import open_filesystem
    from genbatch.parallel.dims import ParallelDims

    mode = cache_mode(options.run_args)
    quantized = quantization_of(options.run_args)
    approximate = {layout_name(layout) for layout in layouts
                   if options.recipe is not None or mode is not None or quantized != "none" or stale(layout)}
    if not approximate:
        return {}
    left_out = ", ".join(([] if options.recipe is None else ["the base model at the suite's steps, no LoRA"])
                         + ([f"--cache {mode} left out"] if mode is not None else [])
                         + ([f"unquantized weights ({quantized} left out)"] if quantized != "none" else [])
                         + ["exact attention"])
    options.say(f"gen bench: the exact configuration ({left_out}), for the outputs' quality ...")
    reference = next((layout for layout in layouts if not stale(layout)), ParallelDims())
    exact_runner = replace(runner, out=f"{runner.out}/exact", run_args=without_cache(options.run_args),
                           manifest_url=runner.manifest_url if options.recipe is None else
                           f"{runner.out}/{BASE_MANIFEST}")
    (exact,) = exact_runner.run_all([reference])
    quality = {}
    if exact.status != 0:
        failures["exact"] = exact.log_tail
    else:
        for name, run in runs.items():
            scores = output_quality(exact.url, run.url, storage) if name in metrics and name in approximate else None
            if scores is not None:
                scores["approximation"] = _approximation(options, mode, quantized, run.layout)
                quality[name] = scores
                metrics[name].extra.update(scores)
    fs, root, _ = open_filesystem(options.out, storage)
    fs.pipe_file(f"{root}/quality.json", json.dumps(quality, indent=2).encode())
    return quality


def _approximation(options: BenchOptions, mode: str | None, quantized: str, layout) -> str:
    """What a scored layout's outputs approximate the reference by, for the report: `quantized fp8`, `step cache
    fbc:0.08`, `stale K/V (PipeFusion)`, `LoRA recipe`, joined by `, `."""
    from genbatch.benchmark.layouts import stale

    parts = ([f"quantized {quantized}"] if quantized != "none" else []) + (
        [f"step cache {mode}"] if mode is not None else [])
    if stale(layout):
        parts.append("stale K/V (" + ("PipeFusion" if layout.pp > 1 else "DistriFusion") + ")")
    if options.recipe is not None:
        parts.append("LoRA recipe")
    return ", ".join(parts)


def _quality_changes(quality: dict, baseline_url: str, storage) -> list:
    """Quality against the baseline's, for the layouts both scored (a PSNR drop past 1 dB regresses)."""
    from genbatch.benchmark.compare import Change
    from genbatch.benchmark.quality import QUALITY_METRICS, load_quality, quality_regressed

    before = load_quality(baseline_url, storage)
    return [Change(layout=name, metric=metric, baseline=before[name][metric], current=scores[metric],
                   regression=quality_regressed(metric, before[name][metric], scores[metric]))
            for name, scores in quality.items() if name in before for metric in QUALITY_METRICS]


def _galleries(runs: dict, storage, say) -> dict[str, str]:
    """`gen report` of each layout's run (OUT/runs/<layout>/report/, made after the run, outside its timing);
    per layout, its index.html relative to OUT. A gallery that cannot be written is said and left out."""
    from genbatch.io import StorageError
    from genbatch.report import ReportOptions, write_report as write_gallery

    galleries = {}
    for name, run in runs.items():
        try:
            write_gallery(ReportOptions(out=run.url, storage_options=storage or {}))
        except (OSError, ValueError, StorageError) as error:
            say(f"gen bench: no gallery of {name} ({type(error).__name__}: {error})")
            continue
        galleries[name] = f"runs/{name}/report/index.html"
    return galleries


def run_bench(options: BenchOptions) -> int:
    """Run the benchmark; returns the exit status (see the module docstring)."""
    import pyarrow as pa

    from genbatch.benchmark.compare import compare, comparison_lines
    from genbatch.benchmark.execute import SuiteRunner
    from genbatch.benchmark.layouts import layout_name
    from genbatch.benchmark.metrics import report_metrics
    from genbatch.benchmark.models import materialize
    from genbatch.benchmark.quality import batch_size_of, cache_mode, quantization_of
    from genbatch.benchmark.report import machine_info, write_report
    from genbatch.io.options import open_filesystem
    from genbatch.io.tables import concat, records_to_table, to_parquet_bytes

    try:
        suite, layouts, baseline, storage = _prepare(options)
    except BenchUsageError as error:
        options.say(f"error: {error}")
        return exit_codes.USAGE
    say = options.say
    say(f"gen bench: suite {suite.name}: model {suite.model.name}, {suite.jobs} jobs, layouts "
        f"{', '.join(layout_name(layout) for layout in layouts)}")
    say(f"gen bench: building or finding {suite.model.name} in the model cache ...")
    model_dir = materialize(suite.model, options.model_cache)
    fs, root, url = open_filesystem(options.out, storage)
    fs.makedirs(root, exist_ok=True)
    rows = suite.manifest_rows()
    recipe = options.recipe
    if recipe is not None:
        say(f"gen bench: few-step night: {recipe.describe(rows[0]['num_inference_steps'], rows[0]['guidance_scale'])}")
        fs.pipe_file(f"{root}/{BASE_MANIFEST}", to_parquet_bytes(records_to_table(rows)))
        rows = recipe.rows(rows)
    fs.pipe_file(f"{root}/manifest.parquet", to_parquet_bytes(records_to_table(rows)))
    runner = SuiteRunner(suite=suite, manifest_url=f"{url}/manifest.parquet", model_dir=model_dir, out=url,
                         storage_args=options.storage_args, storage_options=storage, dtype=options.dtype, say=say,
                         run_args=(*options.run_args, *(recipe.run_args() if recipe else ())),
                         stale_args=options.stale_args)
    runs = runner.run_all(layouts)
    timings = concat([run.timings for run in runs]) if runs else pa.table({})
    metrics = report_metrics(timings)
    names = {layout_name(run.layout): run for run in runs}
    for name, run in names.items():
        if name in metrics:
            metrics[name].extra.update(wall_seconds=run.wall_seconds, status=run.status)
    failures = {name: run.log_tail for name, run in names.items() if run.status != 0 or name not in metrics}
    galleries = _galleries(names, storage, say)
    quality = _quality(options, runner, layouts, names, metrics, failures, storage) if runs else {}
    comparison = None
    if baseline is not None:
        comparison = compare(metrics, baseline, threshold=options.threshold, baseline_url=options.baseline)
        comparison.changes += _quality_changes(quality, options.baseline, storage)
    info = machine_info(suite=suite, model_dir=model_dir, dtype=options.dtype)
    info["cache"] = cache_mode(options.run_args) or "none"  # the step caching every layout ran with
    info["quantization"] = quantization_of(options.run_args)  # and the weights' quantization
    info["batch_size"] = batch_size_of(options.run_args)  # and its rows per forward (`--batch-size`)
    if recipe is not None:
        base = info["manifest"]
        info["recipe"] = recipe.describe(base["num_inference_steps"], base["guidance_scale"])
        info["manifest"] = {**base, "num_inference_steps": recipe.steps, "guidance_scale": recipe.guidance}
    info["galleries"] = galleries
    report_url = write_report(url, timings=timings, metrics=metrics, info=info, comparison=comparison,
                              failures=failures, storage_options=storage)
    for name, item in metrics.items():
        say(f"gen bench: {name:16s} {item.seconds_per_step:8.4f} s/step  {item.jobs_per_hour:9.1f} jobs/hour"
            + (f"  efficiency {item.efficiency:.0%}" if item.efficiency is not None else ""))
    if comparison is not None:
        for line in comparison_lines(comparison):
            say(f"gen bench: {line}")
    say(f"gen bench: report: {report_url}")
    if failures:
        say(f"gen bench: {counted(len(failures), 'layout')} failed: {', '.join(failures)}")
        return exit_codes.JOBS_FAILED
    if comparison is not None and comparison.regressions:
        return REGRESSION
    return exit_codes.OK
