"""genbatch against the plain diffusers pipeline, on one device, on the same work.

    python -m genbatch.benchmark.versus --device cuda --out bench/results/gpu/versus     # bench/gpu.sh
    python -m genbatch.benchmark.versus --device cpu --tiny --out /tmp/versus             # tests, any machine
    python -m genbatch.benchmark.versus --device cpu --suite cpu --out bench/results/cpu/versus

The work is a suite's manifest and model: by default the GPU suite's (Wan 2.1 1.3B architecture, random
weights, bf16, 832x480, 33 frames, 10 steps); `--tiny` the tiny suite's, `--suite cpu` the CPU suite's,
`--suite flux` FLUX.1-dev's architecture at 1024x1024 (`--suite tiny-flux` the same steps at tiny size).
The model is saved once to a directory (`genbatch.benchmark.models`); then
  diffusers  the directory's own pipeline class, `from_pretrained(DIR, dtype=bf16)` and `pipe(...)` per job
             (Wan with an fp32 VAE, `vae=AutoencoderKLWan.from_pretrained(..., dtype=float32)`, the way
             diffusers documents Wan 2.1 text-to-video)
  genbatch   `gen run` of the same rows (in process, one rank), which loads DIR the same way
each in a fresh process. Both are measured by the same `StepClock` (seconds per step: median over jobs of
the interval between consecutive steps' first transformer calls) and the same peak memory (CUDA: the
largest allocated; CPU: the process's peak resident set). With `--rounds N` the sides alternate
(A B B A ...) and the lowest per-round median counts: other work on a shared machine only ever adds time.
The ratio printed is genbatch / diffusers; issue 3's target is at most 1.00x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

from genbatch.benchmark.suites import SUITES

SIDES = ("diffusers", "genbatch")


def _load_rows(manifest: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(manifest).to_pylist()


def _peak_bytes(device, clock) -> int:
    if device.type == "cuda":
        return max(clock.peak_samples)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _diffusers_side(model_dir: str, pipeline_class: str, rows: list[dict], device, dtype,
                    compile_backend: str | None, attention: str) -> dict:
    """diffusers' own way: `compile_repeated_blocks` (fullgraph) for a compiled pairing, its processors'
    attention backend set to the same kernel as genbatch's `--attention`."""
    import diffusers

    from genbatch.parallel.attention.local import KERNELS, set_diffusers_backend

    components = {}
    if pipeline_class == "WanPipeline":
        components["vae"] = diffusers.AutoencoderKLWan.from_pretrained(model_dir, subfolder="vae", dtype=torch.float32)
    pipe = getattr(diffusers, pipeline_class).from_pretrained(model_dir, dtype=dtype, **components).to(device)
    pipe.set_progress_bar_config(disable=True)
    if attention != "auto":
        set_diffusers_backend(pipe.transformer, KERNELS[attention])  # for this model only, as genbatch's side
    if compile_backend is not None:
        pipe.transformer.compile_repeated_blocks(fullgraph=True, backend=compile_backend)
    job_seconds = []
    for row in rows:
        _sync(device)
        started = time.perf_counter()
        video = {"num_frames": row["num_frames"]} if row.get("num_frames") is not None else {}
        negative = {"negative_prompt": row["negative_prompt"]} if row.get("negative_prompt") is not None else {}
        pipe(prompt=row["prompt"], height=row["height"], width=row["width"], **video, **negative,
             num_inference_steps=row["num_inference_steps"], guidance_scale=row["guidance_scale"],
             generator=torch.Generator("cpu").manual_seed(row["seed"]), output_type="np")
        _sync(device)
        job_seconds.append(time.perf_counter() - started)
    return {"job_seconds": job_seconds}


def pipeline_classes(model_dir: str) -> tuple[str, str]:
    """The pipeline class and the transformer class a saved pipeline directory names (its model_index.json)."""
    with open(os.path.join(model_dir, "model_index.json"), encoding="utf-8") as handle:
        index = json.load(handle)
    return index["_class_name"], index["transformer"][1]


def _genbatch_side(model_dir: str, manifest: str, out: str, device, dtype, compile_backend: str | None,
                   attention: str) -> dict:
    from genbatch.io import RunStore
    from genbatch.runner.options import RunOptions
    from genbatch.runner.run import run

    out = os.path.join(out, "run")
    status = run(RunOptions.from_flags(manifest, out, {
        "model": model_dir, "quiet": True, "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "compile": compile_backend is not None, "compile_backend": compile_backend or "inductor",
        "attention": attention}))
    if status != 0:
        raise RuntimeError(f"gen run exited {status}; see {out}/results/")
    rows = RunStore(out).read_timings().to_pylist()
    steps = [row["seconds"] for row in rows if row["stage"] == "denoise_step"]
    per_job: dict[str, float] = {}
    for row in rows:
        if row["stage"] in ("text_encode", "denoise_step", "vae_decode"):
            per_job[row["job_id"]] = per_job.get(row["job_id"], 0.0) + row["seconds"]
    return {"job_seconds": list(per_job.values()), "own_timer_seconds_per_step": statistics.median(steps)}


def _quiet_libraries() -> None:
    """Loading bars and optional-backend warnings of diffusers/transformers would bury the results."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    for logging in (diffusers_logging, transformers_logging):
        logging.disable_progress_bar()
        logging.set_verbosity_error()


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_side(side: str, *, model_dir: str, manifest: str, out: str, device_name: str,
                 compile_backend: str | None = None, attention: str = "auto") -> dict:
    """Run one side in this process and return its measurements."""
    import diffusers

    from genbatch.benchmark.stepclock import StepClock

    _quiet_libraries()
    device = torch.device(device_name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)  # set_device and the memory counters want an index
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = _load_rows(manifest)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    pipeline_class, transformer_class = pipeline_classes(model_dir)
    with StepClock(device=device, module_class=getattr(diffusers, transformer_class)) as clock:
        if side == "diffusers":
            result = _diffusers_side(model_dir, pipeline_class, rows, device, dtype, compile_backend, attention)
        else:
            result = _genbatch_side(model_dir, manifest, out, device, dtype, compile_backend, attention)
    periods = clock.step_periods(jobs=len(rows), steps=rows[0]["num_inference_steps"])
    return {**result, "side": side, "pipeline": pipeline_class, "compile": compile_backend, "attention": attention, "step_periods": periods, "seconds_per_step": clock.per_step(periods),
            "peak_bytes": _peak_bytes(device, clock)}


def _run_side(side: str, *, model_dir: str, manifest: str, out: str, device: str, kernel_args: list[str]) -> None:
    """One side in a fresh process (its own peak memory, nothing cached from the other side); it writes
    OUT/<side>.json."""
    command = [sys.executable, "-m", "genbatch.benchmark.versus", "--side", side, "--device", device,
               "--model-dir", model_dir, "--manifest", manifest, "--out", out, *kernel_args]
    subprocess.run(command, check=True)


def compare_sides(*, suite_name: str, device: str, out: str, jobs: int | None, rounds: int, model_cache: str | None,
                  say=print, kernel_args: tuple[str, ...] = ()) -> dict:
    """Measure both sides (`rounds` times, alternating which goes first) and return the summary."""
    from genbatch.benchmark.models import materialize
    from genbatch.io.tables import records_to_table, to_parquet_bytes

    suite = SUITES[suite_name]
    rows = suite.manifest_rows()[: jobs or None]
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):  # sides of an earlier comparison in this folder would be counted
        if name.split("-")[0] in SIDES:
            shutil.rmtree(os.path.join(out, name))
    manifest = os.path.join(out, "manifest.parquet")
    with open(manifest, "wb") as handle:
        handle.write(to_parquet_bytes(records_to_table(rows)))
    say(f"versus: building or finding {suite.model.name} in the model cache ...")
    model_dir = materialize(suite.model, model_cache)
    for round_index in range(rounds):
        order = SIDES if round_index % 2 == 0 else SIDES[::-1]
        for side in order:
            say(f"versus: round {round_index + 1}/{rounds}: {side}, {len(rows)} jobs on {device} ...")
            side_out = os.path.join(out, f"{side}-{round_index}")
            _run_side(side, model_dir=model_dir, manifest=manifest, out=side_out, device=device,
                      kernel_args=list(kernel_args))
    return summarize(suite, out, device)


def summarize(suite, out: str, device: str) -> dict:
    """The comparison from the sides' results in `out` (<side>-<round>/<side>.json)."""
    rows = _load_rows(os.path.join(out, "manifest.parquet"))
    measured: dict[str, list[dict]] = {}
    for side in SIDES:
        rounds = sorted(name for name in os.listdir(out) if name.startswith(f"{side}-"))
        measured[side] = []
        for name in rounds:
            with open(os.path.join(out, name, f"{side}.json"), encoding="utf-8") as handle:
                measured[side].append(json.load(handle))
    rounds = len(measured["genbatch"])
    summary = {"model": suite.model.name, "model_detail": suite.model.description, "device": _device_name(device),
               "pipeline": measured["genbatch"][0].get("pipeline", "WanPipeline"),
               "work": {key: rows[0].get(key) for key in ("width", "height", "num_frames", "num_inference_steps",
                                                          "guidance_scale")},
               "jobs": len(rows), "rounds": rounds, "dtype": "bf16" if device.startswith("cuda") else "fp32",
               "compile": measured["genbatch"][0].get("compile"), "attention": measured["genbatch"][0].get("attention")}
    for side, results in measured.items():
        # Each round's median; the least disturbed round counts (on a shared machine other work only adds).
        by_round = [statistics.median(result["step_periods"]) for result in results]
        summary[side] = {"seconds_per_step": min(by_round), "seconds_per_step_by_round": by_round,
                         "peak_bytes": max(result["peak_bytes"] for result in results),
                         "seconds_per_job": min(statistics.fmean(result["job_seconds"]) for result in results)}
        if side == "genbatch":
            summary[side]["own_timer_seconds_per_step"] = min(r["own_timer_seconds_per_step"] for r in results)
    summary["ratios"] = {key: summary["genbatch"][key] / summary["diffusers"][key]
                         for key in ("seconds_per_step", "peak_bytes", "seconds_per_job")}
    return summary


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} cores)"


def summary_lines(summary: dict) -> list[str]:
    """The side-by-side table and the ratios (genbatch / diffusers)."""
    work = summary["work"]
    gen, dif, ratio = summary["genbatch"], summary["diffusers"], summary["ratios"]
    frames = f"{work['num_frames']} frames, " if work.get("num_frames") is not None else ""
    lines = [
        f"genbatch vs diffusers {summary.get('pipeline', 'WanPipeline')}.__call__: {summary['model_detail']}, "
        f"{summary['dtype']}, {work['width']}x{work['height']}, {frames}{work['num_inference_steps']} steps, "
        f"{summary['jobs']} jobs x {summary['rounds']} round(s), on {summary['device']}; compile: "
        f"{summary.get('compile') or 'off'} (diffusers: compile_repeated_blocks), attention: "
        f"{summary.get('attention') or 'auto'}",
        f"{'':28s} {'genbatch':>12s} {'diffusers':>12s} {'ratio':>8s}",
        f"{'seconds per step':28s} {gen['seconds_per_step']:12.4f} {dif['seconds_per_step']:12.4f} "
        f"{ratio['seconds_per_step']:7.3f}x",
        f"{'peak memory GiB':28s} {gen['peak_bytes'] / 2**30:12.3f} {dif['peak_bytes'] / 2**30:12.3f} "
        f"{ratio['peak_bytes']:7.3f}x",
        f"{'seconds per job *':28s} {gen['seconds_per_job']:12.3f} {dif['seconds_per_job']:12.3f} "
        f"{ratio['seconds_per_job']:7.3f}x",
        "* diffusers: the whole __call__; genbatch: its text_encode + steps + vae_decode stages (no media encode)",
        f"genbatch's own step timer: {gen['own_timer_seconds_per_step']:.4f} s/step. "
        "Target (issue 3): genbatch at most 1.00x diffusers.",
    ]
    if summary["rounds"] > 1:
        for side in SIDES:
            rounds = ", ".join(f"{value:.4f}" for value in summary[side]["seconds_per_step_by_round"])
            lines.append(f"{side} seconds per step by round: {rounds}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--suite", choices=list(SUITES), default="gpu",
                        help="whose model and manifest to run (default gpu: Wan 2.1 1.3B architecture, 480p; "
                        "flux: FLUX.1-dev architecture, 1024x1024)")
    parser.add_argument("--tiny", action="store_const", dest="suite", const="tiny", help="same as --suite tiny")
    parser.add_argument("--out", default="bench/results/versus", help="folder for the results (versus.json, .md)")
    parser.add_argument("--jobs", type=int, help="use only the first N rows of the suite's manifest")
    parser.add_argument("--rounds", type=int, default=1, help="measure each side this many times, alternating")
    parser.add_argument("--model-cache", help="where the built model is kept (default ~/.cache/genbatch/bench)")
    parser.add_argument("--reprint", action="store_true", help="measure nothing: summarize the results in --out again")
    parser.add_argument("--compile-backend", help="compile both sides with this torch.compile backend: genbatch "
                        "with --compile, diffusers with compile_repeated_blocks(fullgraph=True)")
    parser.add_argument("--attention", default="auto", help="the attention kernel on both sides (gen run's --attention)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        os.makedirs(args.out, exist_ok=True)
        result = measure_side(args.side, model_dir=args.model_dir, manifest=args.manifest, out=args.out,
                              device_name=args.device, compile_backend=args.compile_backend, attention=args.attention)
        with open(os.path.join(args.out, f"{args.side}.json"), "w", encoding="utf-8") as handle:
            json.dump(result, handle)
        return 0
    if args.reprint:
        summary = summarize(SUITES[args.suite], args.out, args.device)
    else:
        kernel_args = (["--compile-backend", args.compile_backend] if args.compile_backend else []) + [
            "--attention", args.attention]
        summary = compare_sides(suite_name=args.suite, device=args.device, out=args.out, jobs=args.jobs,
                                rounds=args.rounds, model_cache=args.model_cache, kernel_args=tuple(kernel_args))
    lines = summary_lines(summary)
    print("\n".join(lines))
    with open(os.path.join(args.out, "versus.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    with open(os.path.join(args.out, "versus.md"), "w", encoding="utf-8") as handle:
        handle.write("# genbatch vs diffusers\n\n```\n" + "\n".join(lines) + "\n```\n")
    return 0


if __name__ == "__main__":
    from genbatch.parallel.teardown import exit_process

    exit_process(main(), skip_finalization=True)  # every result is written and closed: no finalization to crash
