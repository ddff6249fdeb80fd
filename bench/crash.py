"""Crash trials: `gen run --nproc 2` (two dp groups, tiny presets) killed at random moments and rerun after each
kill until the manifest is complete; every job must be done exactly once with the uninterrupted run's output,
nothing may be left behind, and no process of a killed attempt may outlive it by 10 s (see
tests/resume/harness.py for what is checked and when).

    python bench/crash.py --trials 20 [--store local|s3|both] [--max-kills 3] [--kills all,group,usr1]
                          [--pipes 0.5] [--seed 0]

A kill is SIGKILL of every process (all), SIGKILL of the launcher's process group (group: its ranks outlive
it and must end themselves) or SIGUSR1 to the launcher (usr1); --pipes is the share of attempts whose stdout
and stderr are pipes the harness closes at the kill. Prints, per store, trials, kills by kind, attempts, jobs
resumed from a step checkpoint, orphans and violations (both must be 0); exits 1 if there is any violation. `s3` starts its own moto_server on loopback. On 2 CPU cores a trial takes
20-60 s (each attempt starts three Python processes).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.resume.harness import (  # noqa: E402 - after the repository is on the path
    KILLS, CrashReport, Target, crash_trials, uninterrupted_outputs, write_crash_manifest,
)


def _local_targets(root: str):
    return lambda index: Target(url=os.path.join(root, f"trial{index}"))


def _trials(label: str, new_target, args, manifest: str, reference: dict) -> CrashReport:
    started = time.monotonic()
    report = crash_trials(new_target, manifest=manifest, reference=reference, trials=args.trials,
                          rng=random.Random(f"{args.seed}-{label}"), max_kills=args.max_kills,
                          kills=tuple(args.kills.split(",")), pipe_share=args.pipes,
                          log=lambda text: print(f"  {label} {text}", flush=True))
    print(report.line(label) + f" ({time.monotonic() - started:.0f} s)", flush=True)
    for violation in report.violations:
        print(f"  VIOLATION {violation}", flush=True)
    return report


def _s3_trials(args, manifest: str, reference: dict) -> CrashReport:
    from tests.support.s3 import MotoServer

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    with MotoServer() as server:
        endpoint = server.endpoint

        def new_target(index: int) -> Target:
            bucket = endpoint.create_bucket()
            return Target(url=f"s3://{bucket}/run", storage_options=endpoint.storage_options(), env=endpoint.env(),
                          open_uploads=lambda: endpoint.filesystem().list_multipart_uploads(bucket))

        return _trials("s3 (moto)", new_target, args, manifest, reference)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per store")
    parser.add_argument("--store", choices=["local", "s3", "both"], default="both")
    parser.add_argument("--max-kills", type=int, default=3, help="kills per trial: 1 to this many, at random")
    parser.add_argument("--kills", default=",".join(KILLS), help=f"kinds of kill, comma-separated: {', '.join(KILLS)}")
    parser.add_argument("--pipes", type=float, default=0.5,
                        help="share of attempts whose stdout and stderr are pipes closed at the kill")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as root:
        manifest = write_crash_manifest(os.path.join(root, "manifest.parquet"))
        reference = uninterrupted_outputs(manifest, os.path.join(root, "reference"))
        reports = []
        if args.store in ("local", "both"):
            reports.append(_trials("local", _local_targets(root), args, manifest, reference))
        if args.store in ("s3", "both"):
            reports.append(_s3_trials(args, manifest, reference))
    total = sum(len(report.violations) for report in reports)
    print(f"total: trials {sum(r.trials for r in reports)}, kills {sum(r.kills for r in reports)}, "
          f"orphans {sum(r.orphans for r in reports)}, violations {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
