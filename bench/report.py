"""`gen report` of a 100k-row run: the first report (every preview made) beside a later one (every preview reused).

A finished run is written straight into a folder, as `gen run` leaves it: N rows (default 100k) of which 1%
are videos (9 frames of 64x48, H.264) and the rest 64x64 PNG images (the tiny presets' sizes), 0.5% failed and
0.5% rejected rows, a done marker per job, the results table, run.json, a manifest of N rows and 6 timing rows
per job over 8 ranks and 2 attempts. Then `gen report OUT` runs as a command, twice: the first makes every
thumbnail, poster and preview; the second finds them all and only writes the pages. A third run with
`--workers 1` shows what the preview threads buy.

Target on the 2-core CPU machine: a 100k-row results table renders in at most 60 s (the first report, every
preview made).

    python bench/report.py [--rows 100000] [--video-share 0.01] [--work DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from genbatch.io import RunStore, encode_mp4, encode_png  # noqa: E402
from genbatch.io import markers, tables  # noqa: E402
from genbatch.io.layout import encode_id  # noqa: E402


def _media(count: int, seed: int, video: bool) -> list[bytes]:
    """`count` distinct small outputs (smooth colour fields with a little noise, as a model's are)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        base = rng.integers(0, 256, 3)
        shape = (9, 48, 64, 3) if video else (64, 64, 3)
        ramp = np.linspace(0, 80, shape[-2])[None, :, None]
        pixels = np.clip(base + ramp + rng.normal(0, 12, shape), 0, 255).astype(np.uint8)
        out.append(encode_mp4(pixels, 8) if video else encode_png(pixels))
    return out


def write_run(out: Path, rows: int, video_share: float) -> dict:
    """A finished run of `rows` manifest rows in `out`; what it holds."""
    import hashlib

    store = RunStore(str(out))
    images, videos = _media(16, 0, False), _media(8, 1, True)
    every_video = max(1, round(1 / video_share)) if video_share > 0 else 0
    failed_every, rejected_every = 200, 200
    ids = [f"job-{i:06d}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "prompt": [f"prompt {i}: a small red cube on a wooden table" for i in range(rows)],
                             "model": ["tiny-wan" if every_video and i % every_video == 0 else "tiny-flux"
                                       for i in range(rows)]}), out.parent / "manifest.parquet")
    for folder in ("outputs", "done", "failed"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    timing_rows, rejected, counts = [], [], {"done": 0, "failed": 0, "rejected": 0, "videos": 0}
    start = 1.8e9
    for i, job_id in enumerate(ids):
        video = bool(every_video) and i % every_video == 0
        model = "tiny-wan" if video else "tiny-flux"
        record = {"row": i, "prompt": f"prompt {i}: a small red cube on a wooden table", "model": model, "seed": i,
                  "width": 64, "height": 48 if video else 64, "num_frames": 9 if video else None,
                  "fps": 8 if video else None, "num_inference_steps": 2, "guidance_scale": 5.0, "cache": "none",
                  "attention_approximation": "exact", "vae_decode": "full", "rank": i % 8, "run_id": f"a{i * 2 // rows}"}
        if i % rejected_every == 7:
            rejected.append({"id": job_id, "row": i, "column": "width", "reason": "60 is not a multiple of 16 (use 64)"})
            counts["rejected"] += 1
            continue
        if i % failed_every == 3:
            body = markers.failure_marker({**record, "error": "NonFiniteLatents: the latents hold NaN/inf"},
                                          attempt=record["run_id"], failed_in=[record["run_id"]])
            (out / "failed" / f"{encode_id(job_id)}.json").write_bytes(body)
            counts["failed"] += 1
            continue
        media = (videos if video else images)[i % (8 if video else 16)]
        ext = "mp4" if video else "png"
        (out / "outputs" / f"{job_id}.{ext}").write_bytes(media)
        stages = {"text_encode_s": 0.02, "denoise_s": 0.5, "vae_decode_s": 0.05, "compress_s": 0.01}
        body = markers.done_marker({**record, **stages}, output_uri=f"{out}/outputs/{job_id}.{ext}",
                                   output_bytes=len(media), output_sha256=hashlib.sha256(media).hexdigest(),
                                   token="bench", attempt=record["run_id"])
        (out / "done" / f"{job_id}.json").write_bytes(body)
        counts["done"] += 1
        counts["videos"] += video
        begin = start + (i // 8) * 0.6 + (0 if record["run_id"] == "a0" else 3600)
        for stage, seconds in (("text_encode", 0.02), ("denoise_step", 0.25), ("denoise_step", 0.25),
                               ("vae_decode", 0.05), ("compress", 0.01), ("write", 0.01)):
            timing_rows.append({"run_id": record["run_id"], "job_id": job_id, "rank": i % 8, "stage": stage,
                                "start": begin, "seconds": seconds, "layout": "dp8"})
            begin += seconds
    (out / "timings").mkdir(exist_ok=True)
    pq.write_table(tables.timings_table(timing_rows), out / "timings" / "bench-r00000-000000-000000.parquet")
    store.write_rejected(rejected)
    store.write_run_info({"run_id": "a1", "manifest": str(out.parent / "manifest.parquet"), "out": str(out),
                          "layout": "dp8", "world_size": 8, "started": start, "ended": start + 7200})
    store.write_results()
    return counts


def report(out: Path, *extra: str) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "genbatch", "report", str(out), "--json", *extra],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"gen report failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return wall, json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--video-share", type=float, default=0.01)
    parser.add_argument("--work", help="Folder for the run (default: a temp folder, removed after)")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="genbatch-bench-report-"))
    out = work / "run"
    try:
        made = time.perf_counter()
        counts = write_run(out, args.rows, args.video_share)
        setup = time.perf_counter() - made
        first_s, first = report(out)
        again_s, again = report(out)
        shutil.rmtree(out / "report")
        one_s, one = report(out, "--workers", "1")
        size = sum(f.stat().st_size for f in (out / "report").rglob("*") if f.is_file())
        print(f"gen report of a {args.rows}-row run (written in {setup:.0f} s): {counts['done']} done "
              f"({counts['videos']} videos), {counts['failed']} failed, {counts['rejected']} rejected; "
              f"machine: {os.cpu_count()} CPUs")
        print()
        print("                           wall s   previews made  reused   pages   s per 1k rows")
        for name, wall, numbers in (("first (8 threads)", first_s, first), ("again (all reused)", again_s, again),
                                    ("first (--workers 1)", one_s, one)):
            print(f"  {name:22s} {wall:9.1f} {numbers['previews_made']:15d} {numbers['previews_reused']:7d} "
                  f"{numbers['pages']:7d} {wall / args.rows * 1000:15.3f}")
        print()
        print(f"report folder: {size / 2**20:.0f} MiB; 8 threads against 1: {one_s / first_s:.2f}x; "
              f"a later report against the first: {again_s / first_s:.2f}x")
        print(f"Target: a {args.rows}-row results table renders in <= 60 s ({first_s:.1f} s first, {again_s:.1f} s "
              "reused).")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
