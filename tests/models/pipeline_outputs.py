"""Helpers for the family tests: a job's frames through genbatch's executor, and the same job through the
diffusers pipeline's own `__call__`, so a test can compare the two by `tests/runner/test_equivalence.py`'s
criteria."""

from __future__ import annotations

import numpy as np
import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support.runs import job_executor


def random_image(path, size: tuple[int, int]) -> str:
    """A PNG of random pixels, `size` (width, height), written to `path` (the same pixels for the same size)."""
    from PIL import Image

    pixels = np.random.default_rng(sum(size)).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path)


def saved_preset(name: str, directory) -> str:
    """The preset `name` written to `directory` with save_pretrained (loaded back through from_pretrained)."""
    pipe = load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32)
    pipe.save_pretrained(directory)
    return str(directory)


def genbatch_frames(model: str, spec_job, out: str) -> np.ndarray:
    with job_executor(out, model=model) as (world, executor):
        return executor.generate(spec_job, JobTimer(world.ctx.device))


def pipeline_frames(model: str, spec_job, **call) -> np.ndarray:
    """The pipeline's output for the job's prompt, sizes, steps and seed, plus the call arguments `call`."""
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    output = pipe(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width,
                  num_inference_steps=spec_job.num_inference_steps,
                  generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np", **call)
    return output.frames[0] if spec_job.num_frames is not None else output.images[0]


def assert_pipefusion_refuses(preset: str, image: str, tmp_path) -> None:
    """`gen run --pipefusion 2` of an edit row of `preset` exits 2 naming the model, why (its patches would hold
    the output's rows only, not the input's tokens) and the flags that split the joined stream."""
    from tests.support.runs import run_cli_on_ranks, write_manifest

    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "edit", "prompt": "a red boat", "model": preset,
                                                             "image": image}])
    result = run_cli_on_ranks(2, "run", manifest, "--out", str(tmp_path / "out"), "--pipefusion", "2", "-q")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"model {preset}: its input image's tokens join the image stream" in result.stderr
    assert "--ulysses/--ring" in result.stderr
