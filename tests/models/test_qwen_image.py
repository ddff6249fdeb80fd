"""Qwen-Image: a job's output equals `QwenImagePipeline`'s own (identical pixels), with true CFG (a negative
prompt) and without (one branch, as the pipeline runs a row without a negative prompt), from the preset and
from a saved directory; and a cfg 2 layout, with and without FSDP, runs a row without a negative prompt as one
process does."""

from __future__ import annotations


import numpy as np
import pytest

from genbatch.models import family
from genbatch.models.hooks import COND, UNCOND
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import genbatch_frames, pipeline_frames, saved_preset
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

PRESET = "tiny-qwen-image"


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("qwen") / "model")


@pytest.mark.parametrize("negative", [None, "blurry, low quality"], ids=["one-branch", "true-cfg"])
@pytest.mark.parametrize("from_directory", [False, True], ids=["preset", "directory"])
def test_output_equals_the_diffusers_pipeline(negative, from_directory, directory, tmp_path):
    model = directory if from_directory else PRESET
    spec_job = job(PRESET, model=model, seed=1234, negative_prompt=negative, guidance_scale=4.0)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    call = {"true_cfg_scale": spec_job.guidance_scale}  # the manifest's guidance_scale is true CFG's scale
    if negative is not None:
        call["negative_prompt"] = negative
    theirs = pipeline_frames(model, spec_job, **call)
    assert ours.shape == theirs.shape == (64, 64, 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01  # a real image, not a constant


def test_true_cfg_needs_a_negative_prompt_and_a_scale_above_one():
    import torch

    hooks = family("qwen-image").hooks
    from genbatch.models import resolve_model

    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    branches = {
        (negative, scale): sorted(hooks.encode(pipe, job(PRESET, negative_prompt=negative, guidance_scale=scale),
                                               torch.device("cpu")).branches)
        for negative in (None, "grey") for scale in (1.0, 4.0)
    }
    assert branches == {(None, 1.0): [COND], (None, 4.0): [COND], ("grey", 1.0): [COND],
                        ("grey", 4.0): sorted([COND, UNCOND])}


def test_true_cfg_rescales_to_the_conditional_norm():
    import torch

    cond, uncond = torch.randn(1, 16, 8), torch.randn(1, 16, 8)
    guided = family("qwen-image").hooks.combine({COND: cond, UNCOND: uncond}, 4.0, None)
    torch.testing.assert_close(guided.norm(dim=-1), cond.norm(dim=-1))
    direction = uncond + 4.0 * (cond - uncond)
    torch.testing.assert_close(guided / guided.norm(dim=-1, keepdim=True),
                               direction / direction.norm(dim=-1, keepdim=True))
    assert family("qwen-image").hooks.combine({COND: cond}, 4.0, None) is cond


ONE_BRANCH = job(PRESET, seed=21, num_inference_steps=3, negative_prompt=None)
TWO_BRANCHES = job(PRESET, seed=22, num_inference_steps=3, negative_prompt="grey")


def _run(spec_job, out, **layout):
    """(latents, frames or None, transformer forwards on this rank, cfg-exchange bytes, the decode mode used)."""
    from genbatch.models import resolve_model

    with job_executor(out, **layout) as (world, executor):
        transformer = executor.pipelines.get(resolve_model(spec_job.model)).transformer
        forwards = []
        handle = transformer.register_forward_pre_hook(lambda *_: forwards.append(1))
        timer = JobTimer(world.ctx.device)
        latents = drive.denoise(executor, spec_job, timer)
        frames = drive.decode(executor, spec_job, latents, timer)
        handle.remove()
    exchanged = sum(interval.extra.get("bytes_cfg_exchange", 0) for interval in timer.intervals)
    return latents, frames, len(forwards), exchanged, executor.decoder.last_mode


JOBS = (ONE_BRANCH, TWO_BRANCHES)


def _cfg_two(rank, world_size, out):
    # each job without and with FSDP (the text encoder and transformer sharded over the two cfg ranks)
    return [_run(spec_job, f"{out}/{index}-{fsdp}", dp=1, cfg=2, fsdp=fsdp)
            for fsdp in (False, True) for index, spec_job in enumerate(JOBS)]


def test_cfg_2_runs_a_row_without_a_negative_prompt_as_one_process(tmp_path):
    """Such a row has one branch: both cfg ranks run it (one forward a step each, no exchange), as a CFG family's
    row with guidance_scale <= 1 runs; a row with a negative prompt splits its two branches over the halves."""
    references = [_run(spec_job, str(tmp_path / f"ref{index}")) for index, spec_job in enumerate(JOBS)]
    per_rank = run_on_ranks(_cfg_two, 2, args=(str(tmp_path / "cfg2"),), timeout_s=90)
    steps = ONE_BRANCH.num_inference_steps
    for position in range(2 * len(JOBS)):
        index = position % len(JOBS)
        ref_latents, ref_frames, ref_forwards, _, _ = references[index]
        assert ref_forwards == steps * (index + 1)  # one process: one forward a branch a step
        for rank, results in enumerate(per_rank):
            latents, frames, forwards, exchanged, mode = results[position]
            assert (latents - ref_latents).abs().max().item() <= 1e-5, f"run {position} rank {rank}"
            assert forwards == steps, f"run {position} rank {rank}: one forward a step"
            assert (exchanged > 0) == (index == 1), f"run {position} rank {rank}: exchange only with two branches"
            # the VAE (Wan 2.1's under Qwen-Image's names) decodes patch-parallel over the group (--vae-decode
            # auto), the frames gathered to the leader
            assert mode == "parallel", f"run {position} rank {rank}: {mode}"
            if rank == 0:
                assert np.abs(frames - ref_frames).max() <= 1e-4
            else:
                assert frames is None
