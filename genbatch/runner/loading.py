"""Loading a model: a built-in preset, or a diffusers pipeline directory through `from_pretrained` (offline).

Weights go to this rank's device in the run's dtype; the VAE of video models stays in fp32 (as the Wan
reference code runs it). Loaded pipelines are kept per model name for the life of the process, so a
manifest that mixes models loads each once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from genbatch.jobs.models import ModelSpec
from genbatch.runner.presets import PRESETS, build_preset

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_dtype(device: torch.device) -> str:
    """bf16 on GPUs, fp32 on the CPU (CPU bf16 matmuls are slow and inexact)."""
    return "bf16" if device.type == "cuda" else "fp32"


def _quiet_loading() -> None:
    """Loading bars of diffusers/transformers would interleave with genbatch's own progress bar."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def load_pipeline(spec: ModelSpec, device: torch.device, dtype: torch.dtype):
    """Build or load the pipeline for `spec`, placed on `device` in `dtype` (VAE of video models in fp32)."""
    _quiet_loading()
    if spec.name in PRESETS:
        pipe = build_preset(spec.name)
        pipe.to(dtype=dtype)
    else:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(spec.name, torch_dtype=dtype, local_files_only=True)
    if spec.is_video:
        pipe.vae.to(torch.float32)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@dataclass(slots=True)
class PipelineCache:
    """Pipelines by model name; `get` loads on first use and applies `prepare` (parallelisation) once."""

    device: torch.device
    dtype: torch.dtype
    prepare: object = None
    """Called as prepare(pipe, spec) after loading (e.g. `genbatch.parallel.apply`), or None."""
    loaded: dict[str, object] = field(default_factory=dict)

    def get(self, spec: ModelSpec):
        if spec.name not in self.loaded:
            pipe = load_pipeline(spec, self.device, self.dtype)
            if self.prepare is not None:
                self.prepare(pipe, spec)
            self.loaded[spec.name] = pipe
        return self.loaded[spec.name]
