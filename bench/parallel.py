"""Every parallel layout on this machine (gloo), tensor-parallel ones beside the others, with the real
`gen run --nproc N`:
seconds per denoising step, bytes sent per step per rank by collective kind, and measured/formula ratios
against seed 000's table (`genbatch.parallel.formulas`).

The model is a Wan 2.1 architecture big enough for about a second per step on a CPU (4 layers, 8 heads x
48, random weights), saved to a directory and loaded with `--model DIR`. On 2 CPU cores, several processes
share the cores, so seconds per step measure overhead and correctness of the machinery, not speedup; the
byte counts are exact whatever the machine.

    python bench/parallel.py [--frames 17] [--size 192] [--steps 3] [--layouts all|quick] [--fp32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))

from overhead import build_model  # noqa: E402  (the same benchmark model as bench/overhead.py)

# (name, dp, cfg, ring, ulysses, fsdp)
LAYOUTS = [
    ("one rank", 1, 1, 1, 1, False),
    ("ulysses 2", 1, 1, 1, 2, False), ("ulysses 2 +fsdp", 1, 1, 1, 2, True),
    ("ring 2", 1, 1, 2, 1, False), ("ring 2 +fsdp", 1, 1, 2, 1, True),
    ("ulysses 2 x ring 2", 1, 1, 2, 2, False), ("ulysses 2 x ring 2 +fsdp", 1, 1, 2, 2, True),
    ("cfg 2", 1, 2, 1, 1, False), ("cfg 2 +fsdp", 1, 2, 1, 1, True),
    ("cfg 2 x ulysses 2", 1, 2, 1, 2, False), ("cfg 2 x ulysses 2 +fsdp", 1, 2, 1, 2, True),
    ("dp 2 x ulysses 2", 2, 1, 1, 2, False),
    ("dp 2 x cfg 2 x ulysses 2", 2, 2, 1, 2, False),
]
# (name, dp, cfg, ring, ulysses, tp, fsdp): tensor parallel, alone and with the other axes
TP_LAYOUTS = [
    ("tp 2", 1, 1, 1, 1, 2, False), ("tp 2 +fsdp over cfg 2", 1, 2, 1, 1, 2, True),
    ("ulysses 2 x tp 2", 1, 1, 1, 2, 2, False), ("ring 2 x tp 2", 1, 1, 2, 1, 2, False),
    ("cfg 2 x tp 2", 1, 2, 1, 1, 2, False), ("dp 2 x tp 2", 2, 1, 1, 1, 2, False),
]
QUICK = {"one rank", "ulysses 2", "ring 2", "ulysses 2 x ring 2", "cfg 2", "dp 2 x ulysses 2", "tp 2"}


def run_layout(model_dir, manifest, out, dp, cfg, ring, ulysses, fsdp, dtype, threads=None, tp=1) -> list[dict]:
    """Run one layout with `gen run`; each rank gets `threads` OpenMP threads (default: the cores over the ranks)."""
    world = dp * cfg * ring * ulysses * tp
    command = [sys.executable, "-m", "genbatch", "run", manifest, "--out", out, "--model", model_dir, "-q",
               "--dtype", dtype, "--cfg", str(cfg), "--ring", str(ring), "--ulysses", str(ulysses), "--tp", str(tp)]
    if fsdp:
        command.append("--fsdp")
    if world > 1:
        command += ["--nproc", str(world)]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(threads or max(1, (os.cpu_count() or 1) // world))}
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}\nfailed with status {done.returncode}:\n{done.stderr[-4000:]}")
    return pq.read_table(os.path.join(out, "timings")).to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--size", type=int, default=192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layouts", choices=["all", "quick"], default="all")
    parser.add_argument("--fp32", action="store_true", help="fp32 instead of bf16 (bytes double)")
    args = parser.parse_args()

    from genbatch.models import family, resolve_model
    from genbatch.parallel.formulas import StepShape, bytes_per_step, tp_all_reduce_tokens

    dtype = "fp32" if args.fp32 else "bf16"
    with tempfile.TemporaryDirectory() as root:
        model_dir = os.path.join(root, "model")
        build_model(model_dir)
        spec = resolve_model(model_dir)
        from diffusers import WanTransformer3DModel

        parameters = sum(p.numel() for p in WanTransformer3DModel.from_pretrained(model_dir, subfolder="transformer").parameters())
        latent = spec.latent_shape(args.size, args.size, args.frames)
        tokens = spec.tokens(args.size, args.size, args.frames)
        plan = family("wan").transformer_parts("WanTransformer3DModel").tensor_splits
        shape = StepShape(
            tokens=tokens, width=spec.hidden_size, layers=spec.num_layers,
            parameters=parameters, prediction_values=16 * latent[0] * latent[1] * latent[2],
            value_bytes=4 if args.fp32 else 2,
            all_reduce_tokens=tp_all_reduce_tokens(plan, {"blocks": spec.num_layers}, image_tokens=tokens,
                                                   text_tokens=spec.text_tokens, joint=False),
        )
        print(f"model: Wan, {spec.num_layers} layers, {spec.num_heads} heads x {spec.head_dim}, "
              f"{parameters / 1e6:.1f}M parameters; N = {shape.tokens} tokens, {dtype}, {args.steps} steps")
        header = f"{'layout':28s} {'ranks':>5s} {'s/step':>8s}  bytes per step per rank (measured/formula)"
        print(header)
        print("-" * len(header))
        layouts = [(name, dp, cfg, ring, ulysses, 1, fsdp) for name, dp, cfg, ring, ulysses, fsdp in LAYOUTS]
        for name, dp, cfg, ring, ulysses, tp, fsdp in layouts + TP_LAYOUTS:
            if args.layouts == "quick" and name not in QUICK:
                continue
            rows = [{"id": f"clip-{index}", "prompt": "a harbour at dawn", "seed": 5, "width": args.size,
                     "height": args.size, "num_frames": args.frames, "num_inference_steps": args.steps,
                     "guidance_scale": 5.0} for index in range(dp)]
            manifest = os.path.join(root, f"m-{dp}.parquet")
            pq.write_table(pa.Table.from_pylist(rows), manifest)
            out = os.path.join(root, name.replace(" ", "_"))
            timings = run_layout(model_dir, manifest, out, dp, cfg, ring, ulysses, fsdp, dtype, tp=tp)
            steps = [row for row in timings if row["stage"] == "denoise_step"]
            seconds = statistics.median(row["seconds"] for row in steps)
            expected = bytes_per_step(shape, cfg=cfg, ring=ring, ulysses=ulysses, fsdp=fsdp, uses_cfg=True, tp=tp)
            measured = {kind: statistics.mean((row.get(f"bytes_{kind}") or 0) for row in steps)
                        for kind in sorted({k[6:] for row in steps for k, v in row.items()
                                            if k.startswith("bytes_") and v})}
            cells = []
            for kind in sorted(set(expected) | set(measured) - {"control"}):  # control: the stop flag
                got = measured.get(kind, 0.0)
                want = expected.get(kind)
                ratio = f"{got / want:.3f}" if want else "n/a"
                cells.append(f"{kind} {got / 2**20:.2f} MiB ({ratio})")
            world = dp * cfg * ring * ulysses * tp
            print(f"{name:28s} {world:5d} {seconds:8.3f}  {'; '.join(cells) or '-'}")


if __name__ == "__main__":
    main()
