"""genbatch's parallel layouts against diffusers' own parallelism (`enable_parallelism`), side by side.

    python bench/versus_parallel.py --scale cpu --rounds 2 --out bench/results/cpu/versus_parallel-DATE
    python bench/versus_parallel.py --scale gpu --out DIR                # bench/gpu.sh step 7 (the GPUs present)
    python bench/versus_parallel.py --scale tiny --rounds 1 --out /tmp/v  # the test

For each model family (`--families`: wan, flux) on one directory and one manifest, each layout both sides can
express runs on both: one process (the pairing every other row is scored against), ulysses 2 and 4, ring 2,
ulysses 2 x ring 2, and tp 2. Both sides are started the same way, by torchrun with one process a rank (one
process: a plain process), running `genbatch.benchmark.parallel_sides`: genbatch as `torchrun -m genbatch run`
does, diffusers as its distributed-inference guide shows (`ContextParallelConfig(ulysses_degree, ring_degree)` or
`TensorParallelConfig(tp_degree)` passed to `pipe.transformer.enable_parallelism`). Measured on both:
  seconds a step      the median of one `StepClock` (the interval between consecutive steps' first transformer
                      calls, rank 0); rounds alternate which side goes first (A B B A) and the lowest
                      per-round median counts (other work on a shared machine only ever adds time)
  seconds a job       diffusers: the whole `__call__`; genbatch: its text encode + steps + VAE decode stages
  peak memory         per rank, the largest rank's (CUDA: allocated; CPU: the peak resident set)
  bytes sent a step   per rank, the largest rank's: genbatch's own ledger (its step rows, the stop flag left out);
                      diffusers' collectives counted by wrapping torch.distributed's entry points during the
                      transformer's calls (`genbatch.benchmark.collective_bytes`), under the same rules
  PSNR                of each side's decoded output (both through genbatch's PNG / MP4 encode) against the
                      one-process diffusers output of the same row
The ratios printed are genbatch / diffusers. Where diffusers' side refuses a layout (no plan for the model, a
degree that does not divide, a kernel or a device it does not take), its own error is printed in the row.

A layout that needs more ranks than `--max-ranks` (default: the GPUs present, on a CPU 4 gloo processes) is
printed as not run, with the reason: on one GPU none of the multi-rank layouts can run. Several ranks on one
GPU would share its SMs and memory (NCCL also refuses two ranks on one device), so what they measured would
not be either library's parallel step: only the one-process pairing runs there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass

from genbatch.benchmark.suites import SUITES, Suite

SIDES = ("diffusers", "genbatch")
"""Round 0 runs them in this order, round 1 in the other, and so on (A B B A)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    name: str
    ulysses: int = 1
    ring: int = 1
    tp: int = 1

    @property
    def ranks(self) -> int:
        return self.ulysses * self.ring * self.tp

    @property
    def slug(self) -> str:
        return self.name.replace(" x ", "-x-").replace(" ", "-")

    def args(self) -> list[str]:
        return ["--ulysses", str(self.ulysses), "--ring", str(self.ring), "--tp", str(self.tp)]


ONE_PROCESS = Layout(name="one process")
LAYOUTS = (ONE_PROCESS, Layout(name="ulysses 2", ulysses=2), Layout(name="ulysses 4", ulysses=4),
           Layout(name="ring 2", ring=2), Layout(name="ulysses 2 x ring 2", ulysses=2, ring=2),
           Layout(name="tp 2", tp=2))
"""The layouts diffusers 0.42 can also express: its ContextParallelConfig (ulysses, ring, both) and its
TensorParallelConfig; it has no CFG or data parallel, and takes CP and TP only one at a time."""


def _suite(name: str, model: str, **geometry) -> Suite:
    from genbatch.benchmark.models import MODELS
    from genbatch.parallel.dims import ParallelDims

    return Suite(name=name, model=MODELS[model], layouts=(ParallelDims(),), **geometry)


def cases(scale: str) -> dict[str, Suite]:
    """The work each family runs at `scale`: its model, geometry and rows."""
    if scale == "tiny":
        return {"wan": SUITES["tiny"], "flux": SUITES["tiny-flux"]}
    if scale == "gpu":  # the Wan 2.1 1.3B architecture at 480p and FLUX.1-dev at 1024², as steps 2 and 5
        return {"wan": SUITES["gpu"], "flux": SUITES["flux"]}
    return {"wan": _suite("cpu-wan", "bench-wan", jobs=1, width=256, height=256, num_frames=17,
                          num_inference_steps=4),
            "flux": _suite("cpu-flux", "bench-flux", jobs=1, width=256, height=256, num_frames=None,
                           num_inference_steps=4, guidance_scale=3.5)}


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _rank_results(folder: str) -> list[dict]:
    names = sorted((name for name in os.listdir(folder) if name.startswith("rank-")),
                   key=lambda name: int(name[5:-5]))
    return [_read_json(os.path.join(folder, name)) for name in names]


def run_side(side: str, layout: Layout, *, model_dir: str, manifest: str, folder: str, device: str,
             attention: str, threads: int | None, timeout: float) -> dict:
    """One side of one layout, in fresh processes under torchrun; its outcome as `side.json` in `folder`."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    # one process is a plain process on both sides (how either library runs on one device); more, torchrun's
    launcher = [] if layout.ranks == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                             str(layout.ranks)]
    command = [sys.executable, *launcher, "-m", "genbatch.benchmark.parallel_sides", side, "--model-dir", model_dir,
               "--manifest", manifest, "--out", folder, "--device", device, "--attention", attention, *layout.args()]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    with open(os.path.join(folder, "launch.log"), "w", encoding="utf-8") as log:
        try:
            status = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            status = None
    ranks = [rank for rank in _rank_results(folder) if rank is not None]
    outcome: dict = {"side": side, "layout": layout.name, "ranks": layout.ranks, "status": status}
    errors = [rank["error"] for rank in ranks if "error" in rank]
    if errors:
        outcome["error"] = errors[0]
        outcome["where"] = next(rank.get("where") for rank in ranks if "error" in rank)
    elif status != 0 or len(ranks) != layout.ranks:
        with open(os.path.join(folder, "launch.log"), encoding="utf-8", errors="replace") as handle:
            tail = [line.strip() for line in handle.read().splitlines() if line.strip()]
        said = [line for line in tail if "Error" in line or "genbatch:" in line] or tail
        outcome["error"] = (f"timed out after {timeout:.0f} s" if status is None else f"exit status {status}") + (
            f": {said[-1][:400]}" if said else "")
    with open(os.path.join(folder, "side.json"), "w", encoding="utf-8") as handle:
        json.dump(outcome, handle)
    return outcome


def _genbatch_numbers(folder: str) -> dict:
    """Seconds a job and bytes a step from genbatch's own timings (rank 0's stages; every rank's bytes)."""
    from genbatch.io import RunStore

    rows = RunStore(os.path.join(folder, "run")).read_timings().to_pylist()
    per_job: dict[str, float] = {}
    for row in rows:
        if row["rank"] == 0 and row["stage"] in ("text_encode", "denoise_step", "vae_decode"):
            per_job[row["job_id"]] = per_job.get(row["job_id"], 0.0) + row["seconds"]
    by_rank: dict[int, list[dict]] = {}
    for row in rows:
        if row["stage"] == "denoise_step":
            by_rank.setdefault(row["rank"], []).append(row)
    bytes_by_rank = {}
    for rank, steps in by_rank.items():
        kinds = {key for row in steps for key, value in row.items()
                 if key.startswith("bytes_") and key != "bytes_control" and value}
        bytes_by_rank[rank] = {kind[6:]: sum(row.get(kind) or 0 for row in steps) / len(steps)
                               for kind in sorted(kinds)}
    return {"job_seconds": list(per_job.values()), "bytes_by_rank": bytes_by_rank}


def side_numbers(folder: str) -> dict:
    """One side's round, measured: seconds a step and a job, peak memory and bytes a step per rank."""
    outcome = _read_json(os.path.join(folder, "side.json")) or {"error": "not measured"}
    if "error" in outcome:
        return outcome
    ranks = _rank_results(folder)
    leader = ranks[0]
    numbers = {"seconds_per_step": statistics.median(leader["step_periods"]),
               "peak_bytes": max(rank["peak_bytes"] for rank in ranks)}
    if outcome["side"] == "genbatch":
        counted = _genbatch_numbers(folder)
        numbers["seconds_per_job"] = statistics.fmean(counted["job_seconds"])
        bytes_by_rank = counted["bytes_by_rank"]
    else:
        numbers["seconds_per_job"] = statistics.fmean(leader["job_seconds"])
        bytes_by_rank = {rank["rank"]: rank["bytes_per_step"] for rank in ranks}
    totals = {rank: sum(kinds.values()) for rank, kinds in bytes_by_rank.items()}
    busiest = max(totals, key=totals.get) if totals else None
    numbers["bytes_per_step"] = totals[busiest] if busiest is not None else 0.0
    numbers["bytes_per_step_by_kind"] = bytes_by_rank.get(busiest, {}) if busiest is not None else {}
    quality = _read_json(os.path.join(folder, "quality.json"))
    if quality:
        numbers.update(quality)
    return numbers


def _outputs_root(folder: str, side: str) -> str:
    return os.path.join(folder, "run") if side == "genbatch" else folder


def score(folder: str, side: str, reference: str | None) -> None:
    """PSNR / SSIM of a round's outputs against the reference folder's (written to quality.json)."""
    from genbatch.benchmark.quality import output_quality

    if reference is None or not os.path.isdir(os.path.join(_outputs_root(folder, side), "outputs")):
        return
    quality = output_quality(reference, _outputs_root(folder, side))
    if quality is not None:
        with open(os.path.join(folder, "quality.json"), "w", encoding="utf-8") as handle:
            json.dump({"psnr_db": quality["psnr_db"], "ssim": quality["ssim"]}, handle)


def _prune(folder: str, side: str, *, keep_outputs: bool) -> None:
    """A measured side keeps its numbers (rank files, genbatch's timings and results), not its media, its run's
    resume state or its launcher's log (kept only where the side failed)."""
    run = os.path.join(folder, "run")
    for name in ([] if keep_outputs else ["outputs"]) + ["attempts", "done", "rejected"]:
        shutil.rmtree(os.path.join(_outputs_root(folder, side) if name == "outputs" else run, name),
                      ignore_errors=True)
    os.remove(os.path.join(folder, "launch.log"))


def compare(*, scale: str, families: list[str], layouts: list[Layout], device: str, out: str, rounds: int,
            jobs: int | None, max_ranks: int, attention: str, threads: int | None, timeout: float,
            model_cache: str | None, keep_media: bool, say=print) -> dict:
    """Run every (family, layout, round, side) and return the summary; everything measured stays under `out`."""
    from genbatch.benchmark.models import materialize
    from genbatch.io.tables import records_to_table, to_parquet_bytes

    os.makedirs(out, exist_ok=True)
    settings = {"scale": scale, "device": device, "rounds": rounds, "max_ranks": max_ranks, "attention": attention,
                "threads": threads, "families": families, "layouts": [layout.name for layout in layouts]}
    for family, suite in cases(scale).items():
        if family not in families:
            continue
        family_out = os.path.join(out, family)
        shutil.rmtree(family_out, ignore_errors=True)
        os.makedirs(family_out)
        rows = suite.manifest_rows()[: jobs or None]
        manifest = os.path.join(family_out, "manifest.parquet")
        with open(manifest, "wb") as handle:
            handle.write(to_parquet_bytes(records_to_table(rows)))
        say(f"versus_parallel: {family}: building or finding {suite.model.name} in the model cache ...")
        model_dir = materialize(suite.model, model_cache)
        reference = None
        for layout in layouts:
            layout_out = os.path.join(family_out, layout.slug)
            os.makedirs(layout_out)
            if layout.ranks > max_ranks:
                note = {"not_run": f"needs {layout.ranks} ranks, {max_ranks} allowed here ({_why_not(device)})"}
                with open(os.path.join(layout_out, "not_run.json"), "w", encoding="utf-8") as handle:
                    json.dump(note, handle)
                say(f"versus_parallel: {family} {layout.name}: not run: {note['not_run']}")
                continue
            refused = False
            for round_index in range(rounds):
                for side in SIDES if round_index % 2 == 0 else SIDES[::-1]:
                    if side == "diffusers" and refused:
                        continue
                    say(f"versus_parallel: {family} {layout.name}: round {round_index + 1}/{rounds}: {side} "
                        f"on {layout.ranks} rank(s) ...")
                    folder = os.path.join(layout_out, f"{side}-{round_index}")
                    outcome = run_side(side, layout, model_dir=model_dir, manifest=manifest, folder=folder,
                                       device=device, attention=attention, threads=threads, timeout=timeout)
                    if "error" in outcome:
                        say(f"versus_parallel: {family} {layout.name}: {side} cannot run it: {outcome['error']}")
                        refused = refused or side == "diffusers"
                        continue
                    if layout is ONE_PROCESS and side == "diffusers" and reference is None:
                        reference = folder  # the one-process diffusers output: what every row is scored against
                    score(folder, side, reference)
                    if not keep_media:
                        _prune(folder, side, keep_outputs=folder == reference)
        if reference is not None and not keep_media:
            shutil.rmtree(os.path.join(reference, "outputs"), ignore_errors=True)
    with open(os.path.join(out, "settings.json"), "w", encoding="utf-8") as handle:
        json.dump(settings, handle)
    return summarize(out)


def _why_not(device: str) -> str:
    if device.startswith("cuda"):
        return ("one rank a GPU: ranks sharing a GPU would split its SMs and memory, so the step would measure "
                "neither library's parallel step, and NCCL refuses two ranks on one device")
    return "the limit --max-ranks sets"


def summarize(out: str) -> dict:
    """The comparison from the measurements under `out`."""
    import pyarrow.parquet as pq

    settings = _read_json(os.path.join(out, "settings.json")) or {}
    scale_cases = cases(settings.get("scale", "cpu"))
    summary = {"settings": settings, "device": _device_name(settings.get("device", "cpu")), "families": {}}
    for family in settings.get("families", []):
        family_out = os.path.join(out, family)
        if not os.path.isdir(family_out):
            continue
        rows = pq.read_table(os.path.join(family_out, "manifest.parquet")).to_pylist()
        suite = scale_cases[family]
        entry = {"model": suite.model.name, "model_detail": suite.model.description, "jobs": len(rows),
                 "work": {key: rows[0].get(key) for key in ("width", "height", "num_frames", "num_inference_steps",
                                                            "guidance_scale")}, "layouts": []}
        for layout in LAYOUTS:
            layout_out = os.path.join(family_out, layout.slug)
            if not os.path.isdir(layout_out):
                continue
            record: dict = {"layout": layout.name, "ranks": layout.ranks}
            not_run = _read_json(os.path.join(layout_out, "not_run.json"))
            if not_run:
                record.update(not_run)
                entry["layouts"].append(record)
                continue
            for side in SIDES:
                rounds = sorted((name for name in os.listdir(layout_out) if name.startswith(f"{side}-")),
                                key=lambda name: int(name.rsplit("-", 1)[1]))
                measured = [side_numbers(os.path.join(layout_out, name)) for name in rounds]
                good = [numbers for numbers in measured if "error" not in numbers]
                if not good:
                    record[side] = {"error": next((m["error"] for m in measured), "not measured")}
                    continue
                record[side] = {
                    "seconds_per_step": min(m["seconds_per_step"] for m in good),
                    "seconds_per_step_by_round": [m["seconds_per_step"] for m in good],
                    "seconds_per_job": min(m["seconds_per_job"] for m in good),
                    "peak_bytes": max(m["peak_bytes"] for m in good),
                    "bytes_per_step": good[0]["bytes_per_step"],
                    "bytes_per_step_by_kind": good[0]["bytes_per_step_by_kind"],
                    "psnr_db": good[0].get("psnr_db"), "ssim": good[0].get("ssim"),
                }
            gen, dif = record.get("genbatch", {}), record.get("diffusers", {})
            if "error" not in gen and "error" not in dif:
                record["ratios"] = {key: (gen[key] / dif[key] if dif[key] else None)
                                    for key in ("seconds_per_step", "seconds_per_job", "peak_bytes", "bytes_per_step")}
            entry["layouts"].append(record)
        summary["families"][family] = entry
    return summary


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({os.cpu_count()} cores), gloo"


def _cell(value, fmt: str, width: int) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}{fmt}}"


def summary_lines(summary: dict) -> list[str]:
    """One table per family (genbatch / diffusers ratios), then what diffusers could not run and why."""
    settings = summary["settings"]
    lines = [f"genbatch vs diffusers' own parallelism (pipe.transformer.enable_parallelism), on "
             f"{summary['device']}; {settings.get('rounds')} round(s) a layout, sides alternating (A B B A), the "
             f"lowest per-round median step counts; attention {settings.get('attention')}; "
             f"{settings.get('threads') or 'default'} thread(s) a rank. Ratios: genbatch / diffusers."]
    for family, entry in summary["families"].items():
        work = entry["work"]
        frames = f"{work['num_frames']} frames, " if work.get("num_frames") else ""
        lines += ["", f"{family}: {entry['model_detail']} ({entry['model']}), {work['width']}x{work['height']}, "
                  f"{frames}{work['num_inference_steps']} steps, guidance {work['guidance_scale']}, "
                  f"{entry['jobs']} job(s)",
                  f"{'layout':20s} {'ranks':>5s} | {'s/step':>7s} {'diff':>7s} {'ratio':>6s} | {'s/job':>7s} "
                  f"{'diff':>7s} {'ratio':>6s} | {'GiB/rk':>7s} {'diff':>7s} {'ratio':>6s} | {'MiB/st':>7s} "
                  f"{'diff':>7s} {'ratio':>6s} | {'PSNR dB':>7s} {'diff':>7s}"]
        notes = []
        for record in entry["layouts"]:
            if "not_run" in record:
                notes.append(f"  {record['layout']}: not run on either side: {record['not_run']}")
                continue
            gen, dif, ratio = record.get("genbatch", {}), record.get("diffusers", {}), record.get("ratios", {})

            def value(side, key, scale=1.0):
                return None if "error" in side or side.get(key) is None else side[key] / scale

            cells = [f"{record['layout']:20s} {record['ranks']:5d}"]
            for key, scale, fmt in (("seconds_per_step", 1.0, ".4f"), ("seconds_per_job", 1.0, ".3f"),
                                    ("peak_bytes", 2**30, ".3f"), ("bytes_per_step", 2**20, ".3f")):
                cells.append(f"{_cell(value(gen, key, scale), fmt, 7)} {_cell(value(dif, key, scale), fmt, 7)} "
                             f"{_cell(ratio.get(key), '.3f', 5)}x")
            cells.append(f"{_cell(value(gen, 'psnr_db'), '.1f', 7)} {_cell(value(dif, 'psnr_db'), '.1f', 7)}")
            lines.append(" | ".join(cells))
            for side_name, side in (("diffusers", dif), ("genbatch", gen)):
                if "error" in side:
                    notes.append(f"  {record['layout']}: {side_name} cannot run it: {side['error']}")
        lines += notes
    lines += ["", "s/step: median seconds a step (StepClock, rank 0); s/job: diffusers the whole __call__, genbatch its "
              "text_encode + steps + vae_decode; GiB/rk: the largest rank's peak (CPU: resident set; CUDA: "
              "allocated); MiB/st: bytes sent a step by the busiest rank (genbatch's ledger without the stop flag; "
              "diffusers' torch.distributed calls counted during the transformer's calls); PSNR: the decoded output "
              "against the one-process diffusers output (100: identical)."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=("tiny", "cpu", "gpu"), default="cpu",
                        help="the work: tiny (presets, tests), cpu (bench-wan 256² x 17 frames, bench-flux 256²), "
                        "gpu (Wan 2.1 1.3B architecture 832x480 x 33 frames, FLUX.1-dev 1024²)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda at --scale gpu, else cpu)")
    parser.add_argument("--families", default="wan,flux", help="comma-separated: wan, flux")
    parser.add_argument("--layouts", default="all", help="comma-separated layout names (one process always runs): "
                        + ", ".join(layout.name for layout in LAYOUTS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds a layout, alternating which side goes first")
    parser.add_argument("--jobs", type=int, help="only the first N rows of the family's manifest")
    parser.add_argument("--max-ranks", type=int, help="layouts needing more ranks are printed as not run "
                        "(default: the GPU count on cuda, 4 on a CPU)")
    parser.add_argument("--attention", default="auto", help="the attention kernel on both sides (gen run's "
                        "--attention; diffusers: set_attention_backend with the same kernel)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every rank (default on a CPU: 1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one side of one layout may take")
    parser.add_argument("--model-cache", help="where the built models are kept (default ~/.cache/genbatch/bench)")
    parser.add_argument("--keep-media", action="store_true", help="keep the outputs, resume state and launch logs "
                        "of the sides that ran once they are scored")
    parser.add_argument("--out", default="bench/results/versus_parallel")
    parser.add_argument("--reprint", action="store_true", help="measure nothing: summarize --out again")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if args.scale == "gpu" else "cpu")
    if args.reprint:
        summary = summarize(args.out)
    else:
        if args.max_ranks is None:
            import torch

            args.max_ranks = torch.cuda.device_count() if device.startswith("cuda") else 4
        names = [layout.name for layout in LAYOUTS] if args.layouts == "all" else [
            name.strip() for name in args.layouts.split(",")]
        unknown = [name for name in names if name not in {layout.name for layout in LAYOUTS}]
        if unknown:
            parser.error(f"unknown layout(s) {unknown}; choose from {[layout.name for layout in LAYOUTS]}")
        layouts = [layout for layout in LAYOUTS if layout is ONE_PROCESS or layout.name in names]
        threads = args.threads or (1 if device == "cpu" else None)
        summary = compare(scale=args.scale, families=[f.strip() for f in args.families.split(",")], layouts=layouts,
                          device=device, out=args.out, rounds=args.rounds, jobs=args.jobs, max_ranks=args.max_ranks,
                          attention=args.attention, threads=threads, timeout=args.timeout,
                          model_cache=args.model_cache, keep_media=args.keep_media,
                          say=lambda text: print(text, file=sys.stderr, flush=True))
    lines = summary_lines(summary)
    print("\n".join(lines))
    with open(os.path.join(args.out, "versus_parallel.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    with open(os.path.join(args.out, "versus_parallel.md"), "w", encoding="utf-8") as handle:
        handle.write("# genbatch vs diffusers' own parallelism\n\n```\n" + "\n".join(lines) + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
