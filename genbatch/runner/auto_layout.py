"""`gen run --layout auto`: the planner's best layout for the processes this run was given."""

from __future__ import annotations

import os
import sys

import torch

from genbatch.jobs.quantization import Quantization
from genbatch.parallel.dims import ParallelDims


def _gpu_key(name: str) -> str | None:
    """'NVIDIA H200' -> 'h200': the longest planner GPU key found in the device name."""
    from genbatch.planner.hardware import GPUS

    lowered = name.lower().replace(" ", "")
    matches = [key for key in GPUS if key in lowered]
    return max(matches, key=len) if matches else None


def auto_dims(model: str | None, world_size: int, device: torch.device, profile: str | None = None,
              decode: str = "auto", cache: bool = False, steps: int | None = None,
              guidance: float | None = None, quantization: Quantization | None = None) -> ParallelDims:
    """The best runnable layout for `model` on `world_size` processes of this kind of device, priced with the
    calibration `profile` (name or path) when given and the VAE decoded in mode `decode` (`--vae-decode`), among
    the layouts a step cache runs with when `cache` is on, for jobs of `steps` steps at `guidance` (the run's
    `--steps` / `--guidance`; None: the model's), its weights at `quantization`'s width (no tp or FSDP beside
    it). On CPUs without a CPU profile: data parallelism."""
    speak = os.environ.get("RANK", "0") == "0"
    from genbatch.planner.profile import load_profile

    calibrated = load_profile(profile) if profile is not None else None
    if device.type != "cuda" and (calibrated is None or calibrated.device != "cpu"):
        if speak:
            print("genbatch: --layout auto on CPUs: data parallelism over every process"
                  + (" (the profile was not measured on a CPU)" if calibrated is not None else ""), file=sys.stderr)
        return ParallelDims(dp=world_size)
    if model is None:
        raise ValueError("--layout auto plans the layout for the run's model: pass --model")
    from genbatch.planner.rank import plan

    machine = {}  # a CPU profile plans the ranks on this CPU
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        machine = dict(gpu=_gpu_key(properties.name) or "h100", gpu_mem=properties.total_memory / 2**30)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    best = plan(model, world_size, nodes=max(1, world_size // per_node), profile=calibrated, decode=decode,
                cache=cache, steps=steps, guidance=guidance, quantization=quantization, **machine).best
    if speak:
        using = f" with profile {calibrated.name}" if calibrated is not None else ""
        print(f"genbatch: --layout auto picked {best.layout.describe()} on {world_size} x "
              f"{machine.get('gpu', 'cpu')}{using} (VAE decode: {best.estimate.decode_mode})", file=sys.stderr)
    return best.layout
