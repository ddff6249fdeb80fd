"""`gen run --batch-size auto`: the largest batch, up to `MOST_AUTO` rows, whose activations fit.

The planner prices a batch on the group's fullest rank for the run's layout (`genbatch.planner.batching`):
weights once, activations N times. Every model of the run's jobs is priced at its largest job (width x height
x frames), and the run takes the smallest of their answers, so no batch of any model is priced past the memory.
The memory is the device's: a GPU's total memory, or on CPUs the machine's memory shared by the processes on it.
Rank 0 decides (`World.shared_value`), so every rank forms the same batches.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from genbatch.jobs.table import JobTable
    from genbatch.runner.options import RunOptions
    from genbatch.runner.world import World

MOST_AUTO = 16
"""The largest batch `auto` takes."""


def device_memory_gib(device, processes_here: int) -> float:
    """The memory one rank may fill: the GPU's, or the machine's divided among its `processes_here`."""
    from genbatch.runner.decode import device_memory_bytes

    return device_memory_bytes(device) / 2**30 / (1 if device.type == "cuda" else max(processes_here, 1))


def largest_jobs(jobs) -> dict[str, tuple[int, int, int | None]]:
    """Each model's largest job as (width, height, frames), by pixels x frames."""
    models = jobs.column("model").to_pylist()
    width, height = jobs.numbers("width"), jobs.numbers("height")
    frames = jobs.numbers("num_frames", fill=0)
    size = width.astype(np.int64) * height * np.maximum(frames, 1)
    largest: dict[str, tuple[int, int, int | None]] = {}
    for name in dict.fromkeys(models):
        mine = np.flatnonzero(np.array(models) == name)
        best = mine[np.argmax(size[mine])]
        largest[name] = (int(width[best]), int(height[best]), int(frames[best]) or None)
    return largest


def auto_batch_size(options: RunOptions, world: World, jobs: JobTable) -> int:
    """`--batch-size auto`'s batch size for the run's `jobs` (see the module docstring)."""
    if not len(jobs):
        return 1
    from genbatch.planner.batching import largest_batch_for

    layout = options.layout
    limit = layout.vae_memory_gib or device_memory_gib(world.ctx.device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    sizes = {name: largest_batch_for(name, width, height, frames, world.ctx.dims, limit, decode=layout.vae_decode,
                                     most=MOST_AUTO)
             for name, (width, height, frames) in largest_jobs(jobs).items()}
    chosen = min(sizes.values())
    if not options.quiet:
        detail = ", ".join(f"{name} {size}" for name, size in sizes.items())
        print(f"genbatch: --batch-size auto picked {chosen} ({detail}; {limit:.1f} GiB per rank)", file=sys.stderr)
    return chosen
