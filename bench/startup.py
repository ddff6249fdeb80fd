"""Start-up at scale: `gen run --nproc 2` on manifests of 10k, 100k and 1M rows, and reruns of finished runs.

Per manifest size: seconds from the command's start to the first done marker, and the peak RSS (VmHWM) of
each rank, polled from /proc while the run starts; the run is killed once the first marker is there. A
10-row run gives the RSS baseline. Then a finished run is rerun with every done marker present, locally
and on a real S3 server (moto_server, started as the tests start it), with the markers written directly:
the seconds until the rerun exits with "0 pending", and the seconds of one listing of the done markers,
measured on its own.

The runs use tiny-flux, 32x32 pixels and 1 denoising step, so what is measured is start-up: reading,
validating and ordering the manifest, the broadcast of the jobs, the done-marker listing.

Targets on the 2-core CPU machine: the first done within 30 s at 1M rows; peak RSS per rank at most the
10-row run's plus 300 MiB; start-up time growing no faster than linearly in rows; a rerun of a finished
100k-row run on S3 exiting within 30 s plus the server's own listing time.

    python bench/startup.py [--rows 10000 100000 1000000] [--rerun-rows 100000] [--no-s3] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RUN_ARGS = ["--model", "tiny-flux", "--width", "32", "--height", "32", "--steps", "1", "--nproc", "2"]


def write_manifest(path: Path, rows: int) -> None:
    """`rows` valid rows: unique ids, short prompts, one extra column; the run's options give the sizes."""
    ids = pa.array([f"job-{i:07d}" for i in range(rows)])
    prompts = pa.array([f"prompt {i}: a small red cube on a wooden table" for i in range(rows)])
    category = pa.array([f"c{i % 13}" for i in range(rows)]).dictionary_encode()
    pq.write_table(pa.table({"id": ids, "prompt": prompts, "category": category}), path, row_group_size=65_536)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append(int(entry.name))
    return found


def _ranks(launcher: int) -> list[int]:
    """The launcher's worker processes (`python -m genbatch run`, without --nproc)."""
    ranks = []
    for pid in _children(launcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"genbatch" in argv and b"--nproc" not in argv:
            ranks.append(pid)
    return ranks


def _peak_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _gen(manifest: Path, out: str, env: dict | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "genbatch", "run", str(manifest), "--out", out, *RUN_ARGS, "-q"]
    return subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def first_done(manifest: Path, out: Path, timeout_s: float = 600) -> tuple[float, list[float]]:
    """(seconds to the first done marker, peak RSS in MiB of each rank); the run is then killed."""
    started = time.perf_counter()
    process = _gen(manifest, str(out))
    peaks: dict[int, float] = {}
    done = out / "done"
    try:
        while True:
            for pid in _ranks(process.pid):
                peak = _peak_rss_mib(pid)
                if peak is not None:
                    peaks[pid] = max(peaks.get(pid, 0.0), peak)
            if done.is_dir() and any(name.endswith(".json") for name in os.listdir(done)):
                seconds = time.perf_counter() - started
                break
            if process.poll() is not None:
                raise RuntimeError(f"gen run ended with {process.returncode} before a job was done:\n"
                                   + process.stdout.read().decode(errors="replace")[-3000:])
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"no done marker within {timeout_s} s")
            time.sleep(0.05)
        for pid in _ranks(process.pid):  # the last reading, just before the kill
            peak = _peak_rss_mib(pid)
            if peak is not None:
                peaks[pid] = max(peaks.get(pid, 0.0), peak)
    finally:
        ranks = _ranks(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        for pid in ranks:  # in sessions of their own: killed by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
    return seconds, sorted(peaks.values())


def write_markers(store, ids: list[str]) -> float:
    """What a finished run leaves, written directly: a done marker for every id and the results table that
    consolidates them; seconds taken."""
    from genbatch.io import markers, tables

    started = time.perf_counter()
    bodies = {
        store.layout.done(job_id): markers.done_marker(
            {"id": job_id, "row": row, "model": "tiny-flux"}, output_uri=store.output_uri(job_id, "png"),
            output_bytes=0, output_sha256="", token="bench", attempt="bench",
        )
        for row, job_id in enumerate(ids)
    }
    records = {job_id: markers.flat_done(json.loads(bodies[store.layout.done(job_id)])) for job_id in ids}
    results = tables.to_parquet_bytes(tables.build_results(records, {}, [], ["category"]))
    store.objects.write_whole(store.layout.join("results", "results.parquet"), results)
    if store.fs.protocol == "file" or "file" in store.fs.protocol:
        os.makedirs(store.layout.join("done"), exist_ok=True)
        for path, body in bodies.items():
            with open(path, "wb") as handle:
                handle.write(body)
    else:
        store.fs.pipe(bodies)
    return time.perf_counter() - started


def rerun(manifest: Path, out: str, storage_options: dict | None, env: dict | None, rows: int) -> dict:
    """A finished run rerun: markers for every row written first; seconds to exit, and one listing's."""
    from genbatch.io import RunStore

    store = RunStore(out, storage_options=storage_options)
    with pq.ParquetFile(manifest) as parquet:
        ids = parquet.read(columns=["id"]).column(0).to_pylist()
    writing = write_markers(store, ids)
    started = time.perf_counter()
    listed = len(RunStore(out, storage_options=storage_options).done_ids())
    listing = time.perf_counter() - started
    started = time.perf_counter()
    process = _gen(manifest, out, env)
    output, _ = process.communicate()
    seconds = time.perf_counter() - started
    text = output.decode(errors="replace")
    if process.returncode != 0 or listed != rows:
        raise RuntimeError(f"rerun ended with {process.returncode} ({listed} markers listed):\n{text[-3000:]}")
    info = json.loads(store.objects.read(store.layout.join("run.json")))
    return {"seconds": seconds, "listing": listing, "writing": writing, "summary": info.get("summary")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rerun-rows", type=int, default=100_000)
    parser.add_argument("--no-s3", action="store_true", help="Skip the rerun on the S3 server.")
    parser.add_argument("--work", type=Path, default=None, help="Folder for manifests and runs (default: a temp one).")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="genbatch-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"gen run {' '.join(RUN_ARGS)}; machine: {os.cpu_count()} CPUs")

    results = {}
    for rows in [10, *args.rows]:
        manifest = work / f"m{rows}.parquet"
        write_manifest(manifest, rows)
        results[rows] = first_done(manifest, work / f"run{rows}")
    base_rss = max(results[10][1])
    print(f"\n{'rows':>9} {'first done s':>13} {'s per 100k rows over 10':>24} {'peak RSS/rank MiB':>22} "
          f"{'over 10-row run':>16}")
    for rows, (seconds, peaks) in results.items():
        slope = "" if rows == 10 else f"{(seconds - results[10][0]) / rows * 1e5:.2f}"
        print(f"{rows:>9} {seconds:>13.1f} {slope:>24} {' / '.join(f'{p:.0f}' for p in peaks):>22} "
              f"{max(peaks) - base_rss:>+16.0f}")

    rerun_manifest = work / f"m{args.rerun_rows}.parquet"
    if not rerun_manifest.exists():
        write_manifest(rerun_manifest, args.rerun_rows)
    print(f"\nrerun of a finished {args.rerun_rows}-row run (every done marker present):")
    local = rerun(rerun_manifest, str(work / "rerun-local"), None, None, args.rerun_rows)
    print(f"  local: exit 0 in {local['seconds']:.1f} s; one listing of the markers {local['listing']:.2f} s; "
          f"summary {local['summary']}")
    if not args.no_s3:
        sys.path.insert(0, str(ROOT))
        from tests.support.s3 import MotoServer

        with MotoServer() as server:
            bucket = server.endpoint.create_bucket()
            options = server.endpoint.storage_options()
            s3 = rerun(rerun_manifest, f"s3://{bucket}/run", options, server.endpoint.env(), args.rerun_rows)
        print(f"  S3 (moto_server): exit 0 in {s3['seconds']:.1f} s; one listing of the markers (the server's "
              f"listing time) {s3['listing']:.1f} s; over it {s3['seconds'] - s3['listing']:.1f} s; "
              f"markers written in {s3['writing']:.0f} s; summary {s3['summary']}")


if __name__ == "__main__":
    main()
