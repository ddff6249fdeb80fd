"""Quantized weights side by side with bf16: what they save in memory on the CPU, and on a GPU what they cost in
time and quality.

Memory (the default), on the CPU: a Wan-layout transformer of ~296M parameters (Wan 2.1 1.3B's width, 6 blocks,
random weights saved in bf16: `wan-300m-random` of genbatch.benchmark.models).

    python bench/quantization.py [--size 64] [--frames 5] [--steps 2] [--rows 2] [--threads 2] [--model-cache DIR]

Runs `gen run --dtype bf16` on the same rows three times, each in a fresh process: `--quantization fp8`, then
`int8`, then `none`. For each it prints the transformer's weight bytes as run.json records them (what the rank
loaded), their ratio to bf16's, the process's peak resident memory (the child's own `ru_maxrss`, from `wait4`),
how far that peak fell below bf16's run against the bf16 transformer's bytes, the median seconds a step, and
the outputs' PSNR / SSIM against the bf16 run's (the same rows and seeds). Then the two targets of issue 45: the
recorded bytes at most 0.55x of bf16, and the peak falling by at least a third of the bf16 transformer's bytes.
Nothing is asserted: the numbers are for bench/results/cpu/quantization.txt.

Suites (bench/gpu.sh's step 8): each suite's work (`gpu`: Wan 2.1 1.3B's architecture at 832x480, 33 frames;
`flux`: FLUX.1-dev's at 1024x1024; `tiny`, `tiny-flux`: the same steps at tiny size, on the CPU) under bf16, fp8
and int8 weights, eager, and bf16 and fp8 compiled (`--variants`: some of them), each variant in a fresh process (genbatch's own `gen run`,
in process): seconds a step (the median over jobs of the interval between two steps' first transformer calls,
`genbatch.benchmark.stepclock`), peak device memory (CUDA: the largest allocated; CPU: the peak resident set),
and PSNR / SSIM of the outputs against the bf16 eager variant's. fp8 on a GPU of compute capability 8.9 or more
runs FP8 GEMMs (dynamic activation scaling); elsewhere it is weight-only, as int8 is.

    python bench/quantization.py --suites gpu,flux:none+fp8+int8+fp8-compiled --device cuda --steps 4 --rows 1 \
        --out DIR                                                                           # bench/gpu.sh
    python bench/quantization.py --suites tiny,tiny-flux --device cpu --steps 2 --rows 1 --compile-backend aot_eager \
        --variants none,fp8,fp8-compiled --out DIR                                          # its --tiny form
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

KINDS = ("fp8", "int8", "none")
MIB = 2**20


def _manifest(path: str, args) -> str:
    from genbatch.benchmark.suites import PROMPTS
    from genbatch.io.tables import records_to_table, to_parquet_bytes

    rows = [{"id": f"q-{index:02d}", "prompt": PROMPTS[index % len(PROMPTS)], "seed": 100 + index,
             "width": args.size, "height": args.size, "num_frames": args.frames, "num_inference_steps": args.steps,
             "guidance_scale": 5.0, "fps": 8} for index in range(args.rows)]
    with open(path, "wb") as handle:
        handle.write(to_parquet_bytes(records_to_table(rows)))
    return path


def _side(kind: str, model: str, manifest: str, out: str, threads: int) -> dict:
    """One `gen run` in a fresh process; its run.json's weights, its peak RSS and its median step."""
    from genbatch.io import RunStore

    command = [sys.executable, "-m", "genbatch", "run", manifest, "--out", out, "--model", model, "--dtype", "bf16",
               "--quantization", kind, "-q"]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"gen run --quantization {kind} failed ({status}):\n{output[-3000:]}")
    info = json.loads(open(os.path.join(out, "run.json")).read())
    (weights,) = info["weights"]
    timings = RunStore(out).read_timings().to_pylist()
    steps = [row["seconds"] for row in timings if row["stage"] == "denoise_step" and row.get("step", 0) > 0]
    return {"kind": kind, "transformer": weights["transformer"], "text_encoders": weights["text_encoders"],
            "peak_rss": usage.ru_maxrss * 1024, "step_s": statistics.median(steps) if steps else float("nan"),
            "quantization": info["quantization"]}


VARIANTS = (("none", None), ("fp8", None), ("int8", None), ("none", "compiled"), ("fp8", "compiled"))
"""(quantization, compile) of a suite's variants: every width eager, bf16 and fp8 compiled."""


def _variant_name(kind: str, compiled: str | None) -> str:
    return kind + ("-compiled" if compiled else "")


def _suite_side(args) -> None:
    """One variant of one suite in this process: genbatch's `gen run` of the suite's rows, timed by the StepClock;
    writes OUT/result.json."""
    import diffusers
    import torch

    from genbatch.benchmark.stepclock import StepClock
    from genbatch.benchmark.versus import _peak_bytes, _quiet_libraries, pipeline_classes
    from genbatch.parallel.quantize import method, quiet_torchao_import
    from genbatch.runner.options import RunOptions
    from genbatch.runner.run import run

    quiet_torchao_import()
    _quiet_libraries()
    device = torch.device(args.device if args.device != "cuda" else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    rows = json.loads(open(os.path.join(args.out, "..", "rows.json")).read())
    _, transformer_class = pipeline_classes(args.model_dir)
    flags = {"model": args.model_dir, "quiet": True, "dtype": "bf16" if device.type == "cuda" else "fp32",
             "quantization": args.side, "compile": args.compiled is not None,
             "compile_backend": args.compile_backend}
    with StepClock(device=device, module_class=getattr(diffusers, transformer_class)) as clock:
        status = run(RunOptions.from_flags(args.manifest, os.path.join(args.out, "run"), flags))
    if status != 0:
        raise SystemExit(f"gen run --quantization {args.side} exited {status}")
    periods = clock.step_periods(jobs=len(rows), steps=rows[0]["num_inference_steps"])
    result = {"quantization": args.side,
              "method": method(args.side, device) if args.side != "none" else f"unquantized {flags['dtype']}",
              "compiled": args.compiled, "seconds_per_step": clock.per_step(periods),
              "peak_bytes": _peak_bytes(device, clock),
              "weights": json.loads(open(os.path.join(args.out, "run", "run.json")).read())["weights"]}
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump(result, handle)


def _suites(args) -> None:
    """Every suite's variants, each in a fresh process; the table, OUT/quantization.json and .md."""
    from genbatch.benchmark.models import materialize
    from genbatch.benchmark.quality import output_quality
    from genbatch.benchmark.suites import SUITES
    from genbatch.io.tables import records_to_table, to_parquet_bytes

    summary, lines = {}, []
    for spec in args.suites.split(","):
        name, _, own = spec.partition(":")  # gpu, or flux:none+fp8+fp8-compiled (that suite's own variants)
        suite = SUITES[name]
        rows = [{**row, "num_inference_steps": args.steps} for row in suite.manifest_rows()[: args.rows]]
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        manifest = os.path.join(folder, "manifest.parquet")
        with open(manifest, "wb") as handle:
            handle.write(to_parquet_bytes(records_to_table(rows)))
        with open(os.path.join(folder, "rows.json"), "w") as handle:
            json.dump(rows, handle)
        print(f"quantization: {name}: building or finding {suite.model.name} ...", file=sys.stderr, flush=True)
        model_dir = materialize(suite.model, args.model_cache)
        results = {}
        listed = own.split("+") if own else args.variants.split(",") if args.variants else None
        wanted = {"none", *(listed or map(lambda v: _variant_name(*v), VARIANTS))}
        for kind, compiled in VARIANTS:
            variant = _variant_name(kind, compiled)
            if variant not in wanted:
                continue
            out = os.path.join(folder, variant)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            command = [sys.executable, os.path.abspath(__file__), "--side", kind, "--device", args.device,
                       "--model-dir", model_dir, "--manifest", manifest, "--out", out,
                       "--compile-backend", args.compile_backend, *(["--compiled", "yes"] if compiled else [])]
            print(f"quantization: {name} {variant} ...", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": REPO})
            results[variant] = json.loads(open(os.path.join(out, "result.json")).read())
        reference = os.path.join(folder, "none", "run")
        for variant, result in results.items():
            result.update(output_quality(reference, os.path.join(folder, variant, "run")) or {})
        summary[name] = {"model": suite.model.description, "rows": len(rows), "steps": args.steps,
                         "size": f"{rows[0]['width']}x{rows[0]['height']}", "variants": results}
        bf16 = results["none"]
        lines.append(f"{name}: {suite.model.description}; {len(rows)} rows of {rows[0]['width']}x{rows[0]['height']}"
                     + (f", {rows[0]['num_frames']} frames" if rows[0].get("num_frames") else "")
                     + f", {args.steps} steps on {args.device}")
        lines.append("| variant | method | s/step | x none | peak GiB | x none | transformer GiB | PSNR dB | SSIM |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for variant, result in results.items():
            weights = result["weights"][0]["transformer"] if result["weights"] else 0
            lines.append(f"| {variant} | {result['method']} | {result['seconds_per_step']:.4f} | "
                         f"{result['seconds_per_step'] / bf16['seconds_per_step']:.3f} | "
                         f"{result['peak_bytes'] / 2**30:.2f} | {result['peak_bytes'] / bf16['peak_bytes']:.3f} | "
                         f"{weights / 2**30:.3f} | {min(result.get('psnr_db', 100.0), 100.0):.2f} | "
                         f"{result.get('ssim', 1.0):.4f} |")
        lines.append("")
    with open(os.path.join(args.out, "quantization.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    with open(os.path.join(args.out, "quantization.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-cache", default=None)
    parser.add_argument("--suites", default=None,
                        help="Run these suites' variants (bench/gpu.sh's step 8): NAME or NAME:V1+V2 (its variants).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--out", default=None)
    parser.add_argument("--variants", default=None,
                        help="With --suites: these variants only (none,fp8,int8,none-compiled,fp8-compiled; none "
                             "always runs first: the reference).")
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compiled", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--manifest", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        return _suite_side(args)
    if args.suites is not None:
        if args.out is None:
            raise SystemExit("--suites writes its results to --out DIR")
        return _suites(args)

    from genbatch.benchmark.models import MODELS, materialize
    from genbatch.benchmark.quality import output_quality

    model = MODELS["wan-300m-random"]
    print(f"model: {model.description}", flush=True)
    directory = materialize(model, args.model_cache)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        manifest = _manifest(os.path.join(work, "m.parquet"), args)
        sides = {kind: _side(kind, directory, manifest, os.path.join(work, kind), args.threads) for kind in KINDS}
        quality = {kind: output_quality(os.path.join(work, "none"), os.path.join(work, kind)) for kind in KINDS[:2]}
    bf16 = sides["none"]
    print(f"work: {args.rows} rows of {args.size}x{args.size}, {args.frames} frames, {args.steps} steps, --dtype bf16, "
          f"OMP_NUM_THREADS={args.threads}; {os.cpu_count()} CPUs, load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"{'quantization':>12}  {'transformer MiB':>15}  {'x bf16':>6}  {'peak RSS MiB':>12}  {'RSS saved MiB':>13}  "
          f"{'saved / bf16 transformer':>24}  {'s/step':>7}  {'PSNR dB':>7}  {'SSIM':>6}")
    for kind in KINDS:
        side = sides[kind]
        saved = bf16["peak_rss"] - side["peak_rss"]
        scores = quality.get(kind) or {}
        print(f"{kind:>12}  {side['transformer'] / MIB:15.1f}  {side['transformer'] / bf16['transformer']:6.3f}  "
              f"{side['peak_rss'] / MIB:12.1f}  {saved / MIB:13.1f}  {saved / bf16['transformer']:24.3f}  "
              f"{side['step_s']:7.3f}  {scores.get('psnr_db', float('nan')):7.2f}  {scores.get('ssim', float('nan')):6.4f}")
    for kind in KINDS[:2]:
        side = sides[kind]
        ratio = side["transformer"] / bf16["transformer"]
        saved = (bf16["peak_rss"] - side["peak_rss"]) / bf16["transformer"]
        print(f"{kind}: recorded transformer bytes {ratio:.3f}x of bf16 (target <= 0.55: "
              f"{'met' if ratio <= 0.55 else 'MISSED'}); peak RSS fell by {saved:.3f} of the bf16 transformer's bytes "
              f"(target >= 0.333: {'met' if saved >= 1 / 3 else 'MISSED'})")


if __name__ == "__main__":
    main()
