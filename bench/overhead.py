"""genbatch's overhead over a plain diffusers loop, side by side in one run.

The same jobs (a Wan model big enough that a job takes seconds on a CPU, random weights, saved to a
directory and loaded by both sides through `from_pretrained`) go through
  plain     a loop over `WanPipeline.__call__` that writes each video with diffusers' `export_to_video`
  genbatch  `gen run` (in this process) on a manifest of the same rows, writing MP4s through its RunStore
Seconds per job exclude model loading on both sides: the plain loop is timed from its first call to its last
file written; genbatch from its first job's first stage to its last job's write (from its own timings
table). The two sides alternate (A B B A) so a drift in machine load falls on both.

    python bench/overhead.py [--jobs 4] [--steps 10] [--frames 33] [--size 256] [--rounds 2]

Target: genbatch at most 1.03x the plain loop.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch


def build_model(directory: str) -> None:
    """A Wan 2.1 pipeline with a ~11M-parameter transformer (4 layers, 8 heads x 48), random weights."""
    from diffusers import WanTransformer3DModel

    from genbatch.runner.presets import build_preset

    pipe = build_preset("tiny-wan")
    torch.manual_seed(0)
    pipe.transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=8, attention_head_dim=48, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=1536, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    ).eval()
    pipe.save_pretrained(directory)


def rows(args) -> list[dict]:
    return [
        {"id": f"clip-{index}", "prompt": f"a lighthouse on a cliff at dusk, take {index}", "seed": index,
         "width": args.size, "height": args.size, "num_frames": args.frames, "num_inference_steps": args.steps,
         "guidance_scale": 5.0, "fps": 16}
        for index in range(args.jobs)
    ]


def plain_loop(model_dir: str, jobs: list[dict], out_dir: str) -> float:
    """Seconds per job of a plain diffusers loop that writes MP4s."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import export_to_video

    pipe = DiffusionPipeline.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    for job in jobs:
        frames = pipe(
            prompt=job["prompt"], height=job["height"], width=job["width"], num_frames=job["num_frames"],
            num_inference_steps=job["num_inference_steps"], guidance_scale=job["guidance_scale"],
            generator=torch.Generator("cpu").manual_seed(job["seed"]), output_type="np",
        ).frames[0]
        export_to_video(frames, os.path.join(out_dir, f"{job['id']}.mp4"), fps=job["fps"])
    return (time.perf_counter() - start) / len(jobs)


def genbatch_run(model_dir: str, manifest: str, out_dir: str) -> float:
    """Seconds per job of `gen run`, from its own timings (first stage start to last write end)."""
    from genbatch.runner.options import RunOptions
    from genbatch.runner.run import run

    status = run(RunOptions.from_flags(manifest, out_dir, {"model": model_dir, "quiet": True}))
    if status != 0:
        raise SystemExit(f"gen run failed with status {status}")
    timings = pq.read_table(os.path.join(out_dir, "timings")).to_pylist()
    first = min(row["start"] for row in timings)
    last = max(row["start"] + row["seconds"] for row in timings)
    jobs = len({row["job_id"] for row in timings})
    return (last - first) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="A B B A rounds (each runs both sides twice)")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    with tempfile.TemporaryDirectory() as root:
        model_dir = os.path.join(root, "model")
        build_model(model_dir)
        manifest = os.path.join(root, "manifest.parquet")
        jobs = rows(args)
        pq.write_table(pa.Table.from_pylist(jobs), manifest)
        plain, ours = [], []
        for round_index in range(args.rounds):
            for side in ("plain", "genbatch", "genbatch", "plain"):
                out = os.path.join(root, f"{side}-{round_index}-{len(plain) + len(ours)}")
                if side == "plain":
                    plain.append(plain_loop(model_dir, jobs, out))
                else:
                    ours.append(genbatch_run(model_dir, manifest, out))
                print(f"round {round_index} {side:8s} {(plain if side == 'plain' else ours)[-1]:7.2f} s/job",
                      file=sys.stderr)
        plain_s, ours_s = sum(plain) / len(plain), sum(ours) / len(ours)
        print(f"jobs {args.jobs}  steps {args.steps}  frames {args.frames}  size {args.size}  rounds {args.rounds}")
        print(f"plain diffusers loop : {plain_s:8.3f} s/job")
        print(f"gen run              : {ours_s:8.3f} s/job")
        print(f"ratio genbatch/plain : {ours_s / plain_s:8.3f}   (target <= 1.03)")


if __name__ == "__main__":
    main()
