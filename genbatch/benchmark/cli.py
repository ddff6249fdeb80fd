"""`gen bench`: argument handling only."""

from __future__ import annotations

import inspect
import sys

import click

from genbatch.benchmark.suites import SUITES
from genbatch.manifests.cli import cache_option
from genbatch.parallel.flags import kernel_args, kernel_options, quantization_options
from genbatch.planner.memory import DECODE_CHOICES


@click.command("bench", short_help="Run a benchmark suite over parallel layouts; report to OUT.")
@click.option("--suite", type=click.Choice(list(SUITES)), default="cpu", show_default=True,
              help="The suite to run (each listed under Suites above: the tiny ones take seconds, cpu a few minutes "
              "on a CPU machine, gpu and flux want GPUs).")
@click.option("--out", required=True, help="Where the report goes: a new folder or fsspec URL (one per night).")
@click.option("--baseline", metavar="URL", help="An earlier report's OUT to compare with (the previous night's).")
@click.option("--threshold", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True,
              help="A metric worse than the baseline by more than this fraction is a regression (exit 3).")
@click.option("--layouts", metavar="NAMES",
              help="Run these layouts instead of the suite's: comma-separated, e.g. single,dp2,ulysses2,cfg2-ulysses2.")
@click.option("--model-cache", metavar="DIR",
              help="Where built benchmark models are kept (default ~/.cache/genbatch/bench).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]),
              help="Run dtype (default: bf16 on GPUs, fp32 on CPUs).")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for OUT and the baseline (repeatable).")
@click.option("--overwrite", is_flag=True, help="Replace a report already in OUT.")
@kernel_options
@quantization_options
@cache_option
@click.option("--vae-decode", type=click.Choice(DECODE_CHOICES), default="auto", show_default=True,
              help="How every layout's runs decode (gen run --vae-decode).")
@click.option("--batch-size", default="1", show_default=True, metavar="N|auto",
              help="Rows per forward in every layout's runs (gen run --batch-size); with --cache, the exact run "
                   "the quality is scored against batches the same rows.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=None, metavar="W",
              help="The synchronous steps of the PipeFusion and DistriFusion layouts (gen run --warmup-steps) "
                   "[default: each method's].")
@click.option("--patches", type=click.IntRange(min=1), default=None, metavar="M",
              help="The patches of the PipeFusion layouts (gen run --patches) [default: their stages].")
@click.option("--lora", "lora", multiple=True, metavar="URI",
              help="A few-step night: every layout runs the suite with this distilled LoRA (repeatable; a hub id, "
                   "or a path or URL of a .safetensors file or its directory), scored against the base model.")
@click.option("--lora-scale", "lora_scale", multiple=True, type=float, metavar="S",
              help="The scale of each --lora, paired by order [default: 1.0].")
@click.option("--lora-steps", type=click.IntRange(min=1), default=None,
              help="The steps of a few-step night's rows (with --lora) [default: 4].")
@click.option("--lora-guidance", type=click.FloatRange(min=0), default=None,
              help="The guidance scale of a few-step night's rows (with --lora; 1 runs one branch a step) "
                   "[default: 1].")
def bench_command(suite: str, out: str, baseline: str | None, threshold: float, layouts: str | None,
                  model_cache: str | None, dtype: str | None, storage_option: tuple[str, ...], overwrite: bool,
                  compile: bool, compile_backend: str, attention: str, compile_cache: str | None,
                  quantization: str, quantize_text_encoder: bool, cache: str | None, vae_decode: str, batch_size: str, warmup_steps: int | None, patches: int | None,
                  lora: tuple[str, ...], lora_scale: tuple[float, ...], lora_steps: int | None,
                  lora_guidance: float | None) -> None:
    """Run a benchmark suite over parallel layouts; report to OUT.

    Every layout is a real `gen run` of the suite's fixed manifest. Progress goes to stderr.

    \b
    Report:  OUT/report.md (seconds per step by layout and stage, jobs per hour, efficiency against one
             rank, the comparison), OUT/timings.parquet (every timing row, with a layout column),
             OUT/summary.json, OUT/plots/*.png, OUT/runs/<layout>/ (each whole run, and its `gen report`
             gallery in OUT/runs/<layout>/report/index.html, linked from report.md); with --cache,
             --quantization, stale layouts or --lora: OUT/quality.json (each layout's PSNR / SSIM against
             OUT/exact/, the exact, unquantized or base-model run of the same rows).
    Exit:    0 all layouts ran and nothing regressed, 1 a layout failed, 2 usage error,
             3 a regression beyond --threshold against --baseline.
    \b
    Nightly: gen bench --suite cpu --out runs/bench/$(date +%F) --baseline runs/bench/$(date -d yesterday +%F)
    Few-step: gen bench --suite cpu --out runs/bench/4step --lora loras/wan_4step.safetensors --lora-steps 4
    Quantized: gen bench --suite cpu --out runs/bench/fp8 --quantization fp8
    """
    from genbatch.jobs.quantization import parse_quantization
    from genbatch.benchmark.nightly import BenchOptions, run_bench
    from genbatch.benchmark.recipe import FewStepRecipe
    from genbatch.jobs.lora import run_loras
    from genbatch.jobs.batches import parse_size

    try:
        parse_size(batch_size)  # a bad value fails here, naming the fix, not in every layout
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--batch-size") from None
    try:
        quantized = parse_quantization(quantization, quantize_text_encoder)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--quantize-text-encoder") from None
    recipe = None
    if lora or lora_scale or lora_steps is not None or lora_guidance is not None:
        try:
            recipe = FewStepRecipe(lora=run_loras(lora, lora_scale), steps=4 if lora_steps is None else lora_steps,
                                   guidance=1.0 if lora_guidance is None else lora_guidance)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--lora") from None

    options = BenchOptions(out=out, suite=suite, layouts=layouts, baseline=baseline, threshold=threshold,
                           model_cache=model_cache, dtype=dtype, storage_args=storage_option, overwrite=overwrite,
                           run_args=(*kernel_args(compile, compile_backend, attention, compile_cache),
                                     *quantized.flags(),
                                     *(("--cache", cache) if cache else ()),
                                     *(("--vae-decode", vae_decode) if vae_decode != "auto" else ()),
                                     *(("--batch-size", str(batch_size)) if batch_size != "1" else ())),
                           stale_args=(*(("--warmup-steps", str(warmup_steps)) if warmup_steps is not None else ()),
                                       *(("--patches", str(patches)) if patches is not None else ())),
                           recipe=recipe)
    sys.exit(run_bench(options))


def _suites_help() -> str:
    """Every suite of the registry (`genbatch.benchmark.suites.SUITES`), one line each, for the command's help."""
    width = max(len(name) for name in SUITES)
    return "\b\nSuites:\n" + "\n".join(f"  {name:<{width}}  {suite.summary()}" for name, suite in SUITES.items())


bench_command.help = f"{inspect.cleandoc(bench_command.help)}\n\n{_suites_help()}"
