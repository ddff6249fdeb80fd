"""Regenerate the example sbatch scripts in this folder from the `gen submit` commands that make them.

    .venv/bin/python examples/slurm/make_examples.py

rewrites multinode.sbatch, array.sbatch and preemptible.sbatch as `gen submit ... --dry-run` prints them today
(tests/slurm/test_examples.py fails when they are stale). nightly-bench.sbatch is written by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from genbatch.slurm.sbatch import fold_command

HERE = Path(__file__).resolve().parent
ACTIVATE = ("--python", "python3", "--setup", "source $HOME/venvs/genbatch/bin/activate", "--log-dir",
            "/shared/genbatch/logs")

EXAMPLES: dict[str, tuple[str, ...]] = {
    # Wan 2.1 14B on 2 nodes x 8 GPUs: each job on 8 GPUs (Ulysses 4 x CFG 2), 2 jobs at a time (dp 2).
    "multinode.sbatch": (
        "s3://my-bucket/prompts/videos.parquet", "--out", "s3://my-bucket/runs/videos-v1",
        "--nodes", "2", "--gpus-per-node", "8", "--cpus-per-task", "64", "--partition", "gpu", "--time", "12:00:00",
        "--job-name", "wan-videos", *ACTIVATE,
        "--model", "/shared/models/Wan2.1-T2V-14B-Diffusers", "--ulysses", "4", "--cfg", "2",
    ),
    # FLUX images as a job array: 16 independent one-node tasks, each its own share of the manifest.
    "array.sbatch": (
        "s3://my-bucket/prompts/images.parquet", "--out", "s3://my-bucket/runs/images-v1",
        "--nodes", "1", "--gpus-per-node", "8", "--array", "16", "--partition", "gpu", "--time", "04:00:00",
        "--job-name", "flux-images", *ACTIVATE, "--model", "/shared/models/FLUX.1-dev",
    ),
    # On a preemptible partition: USR1 on preemption or 5 minutes before the limit, checkpoint, requeue, resume.
    "preemptible.sbatch": (
        "s3://my-bucket/prompts/videos.parquet", "--out", "s3://my-bucket/runs/videos-spot",
        "--nodes", "1", "--gpus-per-node", "8", "--partition", "preemptible", "--time", "02:00:00",
        "--signal-grace", "300", "--extra-sbatch=--qos=scavenger", "--job-name", "wan-spot", *ACTIVATE,
        "--model", "/shared/models/Wan2.1-T2V-1.3B-Diffusers", "--ulysses", "2", "--checkpoint-every", "5",
    ),
}


def render(name: str) -> str:
    """The example as `gen submit ARGS --dry-run` prints it, with that command as a comment under the shebang."""
    args = EXAMPLES[name]
    result = subprocess.run([sys.executable, "-m", "genbatch", "submit", *args, "--dry-run"],
                            capture_output=True, text=True, check=True)
    shebang, _, rest = result.stdout.partition("\n")
    made_by = fold_command(["gen", "submit", *args, "--dry-run"], indent="#       ")
    return f"{shebang}\n# Made by:\n#   {made_by}\n{rest}"


if __name__ == "__main__":
    for example in EXAMPLES:
        (HERE / example).write_text(render(example))
        print(f"wrote {HERE / example}")
