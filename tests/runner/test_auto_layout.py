"""`--layout auto`: GPU names map to the planner's GPU types; on CPUs every process is its own job group."""

import torch

from genbatch.parallel.dims import ParallelDims
from genbatch.runner.auto_layout import _gpu_key, auto_dims


def test_gpu_names_map_to_planner_types():
    assert _gpu_key("NVIDIA H200") == "h200"
    assert _gpu_key("NVIDIA H100 80GB HBM3") == "h100"
    assert _gpu_key("NVIDIA L40S") == "l40s"
    assert _gpu_key("NVIDIA A100-SXM4-80GB") == "a100"
    assert _gpu_key("Some Unknown Accelerator") is None


def test_cpu_runs_take_data_parallelism():
    assert auto_dims("tiny-wan", 4, torch.device("cpu")) == ParallelDims(dp=4)
