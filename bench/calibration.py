"""Calibrate the planner from a fixed half of `bench/parallel.py`'s layouts and predict the other half.

Each layout runs for real (`gen run --nproc N` under gloo, the benchmark Wan model of `bench/overhead.py`, two
sizes so compute and fixed costs separate). `gen plan --calibrate`'s fit (`genbatch.planner.calibrate`) sees
only the FIT half; the planner's estimate with that profile then predicts the step time of every layout of
the other half, printed beside its measurement. Every rank runs one OpenMP thread (more threads than cores,
on a machine others share, slow a rank several times over); ranks beyond this machine's cores share them,
and the profile's ranks-per-core term (core_sharing) carries that, fitted from the FIT half's 1, 2 and 4 ranks.

The whole list of layouts runs `--repeats` times, one pass after another, so that the machine's changes of speed
(a shared machine's moves both ways, minute to minute) fall on different layouts in different passes; a
measurement made in more than one pass counts at its middle pass (the lower median), in the fit
(`calibrate.typical_of_each`) and in the measured column alike. Within a pass, a job counts at its median step,
and a dp layout at the mean of its groups' equal jobs, which ran at once and shared the cores
(`calibrate.run_means`). The spread column is how much slower the same measurement was in its slowest pass than
in its fastest: the noise the machine itself puts on a measurement, which bounds how closely any model can
predict it.

With --runs DIR the layouts' run folders are kept there, and a later call with the same DIR fits and predicts
from them again without running anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, REPO)

from overhead import build_model  # noqa: E402  (the same benchmark model as bench/overhead.py)
from parallel import LAYOUTS, run_layout  # noqa: E402

FIT = {"one rank", "ulysses 2", "ring 2 +fsdp", "cfg 2", "ulysses 2 x ring 2", "cfg 2 x ulysses 2 +fsdp",
       "dp 2 x ulysses 2"}
"""The layouts the profile is fitted to (every collective kind appears in one of them); the rest are predicted."""
TOLERANCE = 0.20
"""How far a prediction may be from its measurement (a fraction) to count as a pass."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--sizes", default="192,160,128", help="square sizes, comma separated (one job each)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the layouts (a measurement counts at its middle pass)")
    parser.add_argument("--runs", default=None, help="keep the run folders here (and reuse those already there)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    from genbatch.planner.calibrate import (calibrate_runs, format_fit, job_medians, measured_cluster, run_means,
                                            typical_of_each)
    from genbatch.planner.cost import estimate
    from genbatch.planner.measurements import read_steps
    from genbatch.planner.shapes import resolve_shape
    from genbatch.planner.workload import make_workload

    with tempfile.TemporaryDirectory() as scratch:
        root = args.runs or scratch
        model_dir = os.path.join(root, "model")
        if not os.path.isdir(model_dir):
            build_model(model_dir)
        outs: dict[str, list[str]] = {}
        for repeat in range(args.repeats):
            for name, dp, cfg, ring, ulysses, fsdp in LAYOUTS:
                rows = [{"id": f"clip-{size}-{index}", "prompt": "a harbour at dawn", "seed": 5, "width": size,
                         "height": size, "num_frames": args.frames, "num_inference_steps": args.steps,
                         "guidance_scale": 5.0} for size in sizes for index in range(dp)]
                manifest = os.path.join(root, f"m-{dp}.parquet")
                pq.write_table(pa.Table.from_pylist(rows), manifest)
                out = os.path.join(root, name.replace(" ", "_") + (f"-{repeat}" if repeat else ""))
                outs.setdefault(name, []).append(out)
                if os.path.isdir(os.path.join(out, "timings")):
                    continue
                run_layout(model_dir, manifest, out, dp, cfg, ring, ulysses, fsdp, "bf16", threads=1)
                print(f"ran {name} (pass {repeat + 1} of {args.repeats})", file=sys.stderr, flush=True)
        fitted = calibrate_runs([out for name in outs if name in FIT for out in outs[name]], name="bench-cpu")
        print(f"model: the Wan benchmark model of bench/overhead.py, sizes {sizes}, {args.frames} frames, "
              f"{args.steps} steps (the first of each job not used), bf16, {os.cpu_count()} cores, "
              f"{args.repeats} passes (each measurement at its middle pass)")
        print(format_fit(fitted).replace(root + "/", ""))
        print()
        header = (f"{'layout':28s} {'half':>7s} {'ranks':>5s} {'size':>5s} {'measured':>9s} {'predicted':>9s} "
                  f"{'error':>7s} {'spread':>7s}")
        print(header)
        print("-" * len(header))
        errors, spreads = [], []
        shape = resolve_shape(model_dir)
        for name, *_ in LAYOUTS:
            samples = [sample for out in outs[name] for sample in read_steps(out)]
            for size in sizes:
                mine = [sample for sample in samples if sample.width == size]
                sample = mine[0]
                work = make_workload(shape, width=size, height=size, frames=args.frames, steps=args.steps)
                cluster = measured_cluster("cpu", sample.ranks)
                predicted = estimate(sample.layout, work, cluster, fitted.profile).seconds_per_step
                medians = job_medians(mine)
                (typical,) = typical_of_each(medians)  # the middle pass, as the fit counts it
                measured = typical.seconds
                passes = [mean.seconds for mean in run_means(medians)]  # one per pass: its dp groups' mean
                spread = max(passes) / min(passes) - 1  # the same measurement, slowest pass against fastest
                spreads.append(spread)
                error = predicted / measured - 1
                half = "fit" if name in FIT else "predict"
                if half == "predict":
                    errors.append(abs(error))
                print(f"{name:28s} {half:>7s} {sample.ranks:5d} {size:5d} {measured:9.3f} {predicted:9.3f} {error:+7.1%} "
                      f"{spread:+7.0%}")
        within = sum(error <= TOLERANCE for error in errors)
        print(f"\npredicted half: {within} of {len(errors)} within {TOLERANCE:.0%}; mean |error| "
              f"{statistics.mean(errors):.1%}, max {max(errors):.1%}")
        if len(spreads) and max(spreads) > 0:
            print(f"spread of one job's median step over the passes (the machine's own noise): median "
                  f"{statistics.median(spreads):.0%}, max {max(spreads):.0%}")


if __name__ == "__main__":
    main()
