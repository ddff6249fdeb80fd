"""What fp8 and int8 weights save on the CPU, side by side with bf16: a Wan-layout transformer of ~296M parameters
(Wan 2.1 1.3B's width, 6 blocks, random weights saved in bf16: `wan-300m-random` of genbatch.benchmark.models).

    python bench/quantization.py [--size 64] [--frames 5] [--steps 2] [--rows 2] [--threads 2] [--model-cache DIR]

Runs `gen run --dtype bf16` on the same rows three times, each in a fresh process: `--quantization fp8`, then
`int8`, then `none`. For each it prints the transformer's weight bytes as run.json records them (what the rank
loaded), their ratio to bf16's, the process's peak resident memory (the child's own `ru_maxrss`, from `wait4`),
how far that peak fell below bf16's run against the bf16 transformer's bytes, the median seconds a step, and
the outputs' PSNR / SSIM against the bf16 run's (the same rows and seeds). Then the two targets of issue 45: the
recorded bytes at most 0.55x of bf16, and the peak falling by at least a third of the bf16 transformer's bytes.
Nothing is asserted: the numbers are for bench/results/cpu/quantization.txt.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-cache", default=None)
    args = parser.parse_args()

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
