"""Hand a rendered script to `sbatch`, keeping a copy next to the job's logs."""

from __future__ import annotations

import os
import subprocess
import time

import click


def submit_script(script: str, log_dir: str, job_name: str) -> tuple[str, str]:
    """Write `script` under `log_dir` (created if needed), submit it with `sbatch --parsable`.

    Returns (job id, script path). Raises click.ClickException with sbatch's own message when it refuses.
    """
    os.makedirs(log_dir, exist_ok=True)  # Slurm does not create the directory of --output
    path = os.path.join(log_dir, f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch")
    with open(path, "w") as handle:
        handle.write(script)
    try:
        result = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise click.ClickException("sbatch is not on PATH: run gen submit on a Slurm login node "
                                   "(or use --dry-run to print the script)") from None
    if result.returncode != 0:
        raise click.ClickException(f"sbatch refused {path} (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0], path  # --parsable prints "id" or "id;cluster"
