"""`gen run --layout auto`: the planner's best layout for the processes this run was given."""

from __future__ import annotations

import os
import sys

import torch

from genbatch.parallel.dims import ParallelDims


def _gpu_key(name: str) -> str | None:
    """'NVIDIA H200' -> 'h200': the longest planner GPU key found in the device name."""
    from genbatch.planner.hardware import GPUS

    lowered = name.lower().replace(" ", "")
    matches = [key for key in GPUS if key in lowered]
    return max(matches, key=len) if matches else None


def auto_dims(model: str | None, world_size: int, device: torch.device) -> ParallelDims:
    """The best runnable layout for `model` on `world_size` processes of this kind of device."""
    speak = os.environ.get("RANK", "0") == "0"
    if device.type != "cuda":
        if speak:
            print("genbatch: --layout auto on CPUs: data parallelism over every process", file=sys.stderr)
        return ParallelDims(dp=world_size)
    if model is None:
        raise ValueError("--layout auto plans the layout for the run's model: pass --model")
    from genbatch.planner.rank import plan

    properties = torch.cuda.get_device_properties(device)
    gpu = _gpu_key(properties.name) or "h100"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    best = plan(model, world_size, nodes=max(1, world_size // per_node), gpu=gpu,
                gpu_mem=properties.total_memory / 2**30).best
    if speak:
        print(f"genbatch: --layout auto picked {best.layout.describe()} on {world_size} x {gpu}",
              file=sys.stderr)
    return best.layout
