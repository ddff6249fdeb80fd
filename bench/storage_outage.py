"""Storage that goes away: seconds from an S3 outage to the exit of a one-process `gen run`, by --storage-timeout
and kind of outage (a moto_server of its own, stopped with SIGSTOP, so every request hangs; or killed, so every
connection is refused), once three short jobs are done and a long one is running.

    python bench/storage_outage.py [--timeouts 5 20] [--kinds SIGSTOP kill]

Prints one line per case: the exit status (75 expected), the seconds to exit and the first line of the error.
The time is the bound, plus the rest of the running job's denoising (a rank finds the failure at its next
job boundary), plus one short try for the run's last write.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from genbatch.io import RunStore  # noqa: E402 - after the repository is on the path
from tests.support.runs import start_gen, write_manifest  # noqa: E402
from tests.support.s3 import MotoServer  # noqa: E402

ROWS = [
    *({"id": f"short-{n}", "prompt": f"a paper boat, take {n}", "model": "tiny-flux", "num_inference_steps": 3}
      for n in range(3)),
    {"id": "long", "prompt": "a fox running through snow", "model": "tiny-wan", "num_inference_steps": 400},
]


def outage_seconds(timeout_s: float, kind: str, folder: str) -> tuple[int, float, str]:
    """(exit status, seconds from the outage to the exit, first line of stderr) of one case."""
    manifest = write_manifest(os.path.join(folder, f"m-{kind}-{timeout_s:g}.parquet"), ROWS)
    with MotoServer() as server:
        url = f"s3://{server.endpoint.create_bucket()}/run"
        store = RunStore(url, server.endpoint.storage_options())
        process = start_gen("run", manifest, "--out", url, "-q", "--checkpoint-every", "2",
                            "--storage-timeout", f"{timeout_s:g}", env=server.endpoint.env())
        while len(store.done_ids()) < 3:  # hand-out is longest first: the long job runs after the short ones
            if process.poll() is not None:
                raise RuntimeError(f"the run ended before the outage: {process.communicate()[1]}")
            time.sleep(0.05)
        time.sleep(1.0)  # inside the long job
        started = time.monotonic()
        if kind == "SIGSTOP":
            os.kill(server.proc.pid, signal.SIGSTOP)
        else:
            server.proc.kill()
            server.proc.wait()
        _, stderr = process.communicate(timeout=1800)
        seconds = time.monotonic() - started
        if kind == "SIGSTOP":
            os.kill(server.proc.pid, signal.SIGCONT)
    first = next((line for line in stderr.splitlines() if line.startswith("genbatch:")), "")
    return process.returncode, seconds, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[5.0, 20.0])
    parser.add_argument("--kinds", nargs="+", choices=["SIGSTOP", "kill"], default=["SIGSTOP", "kill"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for timeout_s in args.timeouts:
            for kind in args.kinds:
                status, seconds, first = outage_seconds(timeout_s, kind, folder)
                print(f"--storage-timeout {timeout_s:>5g} s  outage {kind:<7}  exit {status}  after {seconds:5.1f} s"
                      f"  ({seconds / timeout_s:.2f} x the bound)  {first[:100]}", flush=True)


if __name__ == "__main__":
    main()
