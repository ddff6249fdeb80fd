"""One rank of one side of `genbatch.benchmark.versus_parallel`, started by torchrun on both sides alike:

    python -m torch.distributed.run --standalone --nproc-per-node N -m genbatch.benchmark.parallel_sides SIDE \\
        --model-dir DIR --manifest M --out OUT --device cpu|cuda [--ulysses U] [--ring R] [--tp T] [--attention K]

  diffusers  the way diffusers' distributed-inference guide shows it: `init_process_group`, the pipeline's
             `from_pretrained(DIR, dtype=...)` moved to this rank's device, `set_attention_backend` when a kernel
             is named, then `pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=U,
             ring_degree=R))` (or `TensorParallelConfig(tp_degree=T)`), and `pipe(...)` per row with a CPU
             generator seeded from the row (every rank starts from the same noise); one process: the plain
             pipeline, no process group. Rank 0 writes each row's media with genbatch's encoders (PNG, or MP4
             at the row's fps), so both sides' outputs go through the same encode before they are compared.
  genbatch   `torchrun -m genbatch run`'s body in this process: `genbatch.runner.run.run` with the layout's
             degrees (`LayoutRequest.of(ulysses=U, ring=R, tp=T)`), which starts the process group and the mesh
             from torchrun's environment; outputs under OUT/run/.

Both sides run under the same `StepClock` (the transformer's calls) and write OUT/rank-<r>.json: the clock's
step periods, each job's seconds (diffusers: the whole `__call__`), the peak memory (CUDA: the largest
allocated; CPU: the process's peak resident set) and, on diffusers' side, the bytes its collectives sent
during the transformer's calls (`CollectiveBytes`; genbatch's own counts are in its timings). When diffusers'
own code refuses the layout (`enable_parallelism`, or the first forward), every rank writes that error
instead and the process exits with `NOT_RUNNABLE`.

On the CPU diffusers computes its device as `rank % torch.accelerator.device_count()`, which is 0 there: the
diffusers side patches `device_count` to 1 on the CPU only (the one change to diffusers' documented steps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from datetime import timedelta

import torch

SIDES = ("genbatch", "diffusers")
NOT_RUNNABLE = 3
"""Exit status of a diffusers side whose own code refused the layout (its error is in the rank files)."""


def _rank_file(out: str) -> str:
    return os.path.join(out, f"rank-{int(os.environ.get('RANK', '0'))}.json")


def _device(name: str) -> torch.device:
    if name.startswith("cuda"):
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(device: torch.device, clock) -> int:
    if device.type == "cuda":
        return max(clock.peak_samples)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _error_text(error: BaseException) -> str:
    """diffusers' own message: the exception's type and its text, on one line where it fits."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:600]}"


def _write_outputs(out: str, rows: list[dict], outputs: list) -> None:
    from genbatch.io import encode_mp4, encode_png
    from genbatch.models.hooks import to_uint8

    folder = os.path.join(out, "outputs")
    os.makedirs(folder, exist_ok=True)
    for row, pixels in zip(rows, outputs, strict=True):
        pixels = to_uint8(pixels)
        if pixels.ndim == 4:  # (F, H, W, 3): a video
            data, ext = encode_mp4(pixels, fps=row.get("fps") or 16), "mp4"
        else:
            data, ext = encode_png(pixels), "png"
        with open(os.path.join(folder, f"{row['id']}.{ext}"), "wb") as handle:
            handle.write(data)


def _diffusers_side(args, rows: list[dict], device: torch.device, dtype: torch.dtype) -> dict:
    import diffusers
    import torch.distributed as dist

    from genbatch.benchmark.collective_bytes import CollectiveBytes
    from genbatch.benchmark.versus import pipeline_classes
    from genbatch.parallel.attention.local import DIFFUSERS_BACKENDS, KERNELS

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=args.collective_timeout))
        if device.type == "cpu":
            torch.accelerator.device_count = lambda: 1  # diffusers: rank % device_count(); 0 on a CPU build
    pipeline_class, _ = pipeline_classes(args.model_dir)
    components = {}
    if pipeline_class == "WanPipeline":  # as diffusers documents Wan 2.1: the VAE in fp32
        components["vae"] = diffusers.AutoencoderKLWan.from_pretrained(args.model_dir, subfolder="vae",
                                                                       dtype=torch.float32)
    pipe = getattr(diffusers, pipeline_class).from_pretrained(args.model_dir, dtype=dtype, **components).to(device)
    pipe.set_progress_bar_config(disable=True)
    counter = CollectiveBytes()
    try:
        if args.attention != "auto":
            pipe.transformer.set_attention_backend(DIFFUSERS_BACKENDS[KERNELS[args.attention]])
        if args.tp > 1:
            pipe.transformer.enable_parallelism(config=diffusers.TensorParallelConfig(tp_degree=args.tp))
        elif args.ulysses > 1 or args.ring > 1:
            pipe.transformer.enable_parallelism(config=diffusers.ContextParallelConfig(
                ulysses_degree=args.ulysses, ring_degree=args.ring))
    except Exception as error:  # noqa: BLE001 - diffusers refused the layout: its message is the result
        return {"error": _error_text(error), "where": "enable_parallelism"}
    # bytes counted during the transformer's calls only: the denoising steps, as genbatch's step rows
    pipe.transformer.register_forward_pre_hook(lambda *_: setattr(counter, "counting", True))
    pipe.transformer.register_forward_hook(lambda *_: setattr(counter, "counting", False))
    job_seconds, outputs = [], []
    with counter:
        for index, row in enumerate(rows):
            video = {"num_frames": row["num_frames"]} if row.get("num_frames") is not None else {}
            _sync(device)
            started = time.perf_counter()
            try:
                result = pipe(prompt=row["prompt"], height=row["height"], width=row["width"], **video,
                              num_inference_steps=row["num_inference_steps"], guidance_scale=row["guidance_scale"],
                              generator=torch.Generator("cpu").manual_seed(row["seed"]), output_type="np")
            except Exception as error:  # noqa: BLE001 - its forward refused the layout (a kernel, a split)
                if index:
                    raise  # a later job failing is a fault, not a layout diffusers cannot run
                return {"error": _error_text(error), "where": "the first forward"}
            _sync(device)
            job_seconds.append(time.perf_counter() - started)
            outputs.append((result.frames if video else result.images)[0])
    if int(os.environ.get("RANK", "0")) == 0:
        _write_outputs(args.out, rows, outputs)
    steps = len(rows) * rows[0]["num_inference_steps"]
    return {"job_seconds": job_seconds, "bytes_per_step": {kind: sent / steps for kind, sent in counter.sent.items()},
            "collective_calls": counter.calls}


def _genbatch_side(args, device: torch.device) -> dict:
    from genbatch.parallel.dims import LayoutRequest
    from genbatch.runner.options import LayoutOptions, ModelOptions
    from genbatch.runner.run import RunOptions, run

    request = LayoutRequest.of(ulysses=args.ulysses, ring=args.ring, tp=args.tp)
    model = ModelOptions(model=args.model_dir, dtype="bf16" if device.type == "cuda" else "fp32",
                         attention=args.attention)
    status = run(RunOptions(manifest=args.manifest, out=os.path.join(args.out, "run"), quiet=True, model=model,
                            layout=LayoutOptions(request=request, collective_timeout=args.collective_timeout)))
    return {"status": status}


def measure(args) -> tuple[dict, int]:
    import diffusers
    import pyarrow.parquet as pq

    from genbatch.benchmark.stepclock import StepClock
    from genbatch.benchmark.versus import _quiet_libraries, pipeline_classes

    _quiet_libraries()
    device = _device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = pq.read_table(args.manifest).to_pylist()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _, transformer_class = pipeline_classes(args.model_dir)
    with StepClock(device=device, module_class=getattr(diffusers, transformer_class)) as clock:
        if args.side == "diffusers":
            result = _diffusers_side(args, rows, device, dtype)
        else:
            result = _genbatch_side(args, device)
    result = {"side": args.side, "rank": int(os.environ.get("RANK", "0")), **result}
    if "error" in result:
        return result, NOT_RUNNABLE
    result["step_periods"] = clock.step_periods(jobs=len(rows), steps=rows[0]["num_inference_steps"])
    result["peak_bytes"] = _peak_bytes(device, clock)
    return result, result.get("status", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ulysses", type=int, default=1)
    parser.add_argument("--ring", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    result, status = measure(args)
    with open(_rank_file(args.out), "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return status


if __name__ == "__main__":
    from genbatch.parallel.teardown import exit_process

    status = main()
    sys.stdout.flush()
    exit_process(status, skip_finalization=True)  # the results are written: no finalization to crash
