"""`--attention`: the kernel choice, its start-up errors, and that the choice reaches every attention path.

CUDA kernels cannot run on this machine: their rules are checked as the pure function `kernel_problem`
of device type, dtype, head size and GPU capability, and the CPU kernels are run."""

from __future__ import annotations

import pytest
import torch

from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.local import KERNELS, auto_backend, check_kernel, kernel_problem, pick_backend
from genbatch.parallel.attention.strategy import make_strategy
from genbatch.parallel.comm import Comm, CommLedger
from genbatch.parallel.flags import ATTENTION_KERNELS
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job, job_executor, run_cli, write_manifest

H100 = (9, 0)
A100 = (8, 0)


def test_the_flag_names_every_kernel():
    assert tuple(KERNELS) == ATTENTION_KERNELS


@pytest.mark.parametrize(("backend", "dtype", "head_dim", "capability", "flash_attn", "problem"), [
    ("flash", torch.float32, 64, H100, False, "takes fp16 or bf16"),
    ("cudnn", torch.float32, 64, H100, False, "takes fp16 or bf16"),
    ("cudnn", torch.bfloat16, 256, H100, False, "up to 128"),
    ("cudnn", torch.bfloat16, 128, (7, 5), False, "sm80"),
    ("flash_attn", torch.bfloat16, 128, H100, False, "flash-attn package"),
    ("efficient", torch.float32, 30, H100, False, "divisible by 4"),
    ("cpu_flash", torch.bfloat16, 128, H100, False, "CPUs only"),
    ("cudnn", torch.bfloat16, 128, H100, False, None),
    ("flash", torch.float16, 256, (8, 0), False, None),
    ("flash_attn", torch.bfloat16, 128, None, True, None),
    ("math", torch.float32, 30, H100, False, None),
])
def test_kernel_rules_on_a_gpu(backend, dtype, head_dim, capability, flash_attn, problem):
    found = kernel_problem(backend, "cuda", dtype, head_dim, capability, flash_attn)
    assert (found is None) if problem is None else (problem in found)


def test_auto_takes_the_fastest_kernel_that_runs():
    assert auto_backend("cuda", torch.bfloat16, 128, H100, True) == "cudnn"  # Hopper: cuDNN first
    assert auto_backend("cuda", torch.bfloat16, 256, H100, True) == "flash_attn"  # head dim past cuDNN's
    assert auto_backend("cuda", torch.bfloat16, 256, H100, False) == "flash"
    assert auto_backend("cuda", torch.bfloat16, 128, A100, True) == "flash_attn"  # Ampere: cuDNN trails
    assert auto_backend("cuda", torch.bfloat16, 128, A100, False) == "flash"
    assert auto_backend("cuda", torch.bfloat16, 128, (7, 5), False) == "efficient"
    assert auto_backend("cuda", torch.float32, 128, H100, False) == "efficient"
    assert auto_backend("cuda", torch.float32, 30, H100, False) == "math"
    assert pick_backend(torch.zeros(1, 2, 2, 8)) == "cpu_flash"


@pytest.mark.parametrize("backend", ["flash", "flash_attn", "cudnn"])
def test_kernels_without_a_mask_are_refused_for_masked_attention(backend):
    problem = kernel_problem(backend, "cuda", torch.bfloat16, 128, H100, True, masked=True)
    assert "takes no key-padding mask" in problem
    assert auto_backend("cuda", torch.bfloat16, 128, H100, True, masked=True) == "efficient"
    assert kernel_problem("efficient", "cuda", torch.bfloat16, 128, H100, True, masked=True) is None


def test_a_kernel_that_cannot_run_names_one_that_can():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="--attention flash-attn needs a CUDA GPU.*--attention cpu-flash works"):
        check_kernel("flash-attn", cpu, torch.float32, 64)
    assert check_kernel("math", cpu, torch.float32, 64) == "math"
    assert check_kernel("cpu-flash", cpu, torch.float32, 64) == "cpu_flash"


def test_gen_run_refuses_a_wrong_kernel_at_start_up_with_exit_2(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-wan", "--attention",
                     "cudnn", "-q")
    assert result.returncode == 2
    assert "--attention cudnn needs a CUDA GPU" in result.stderr and "--attention cpu-flash works" in result.stderr


def test_sequence_parallel_attention_runs_the_chosen_kernel():
    solo = Comm(None, CommLedger())
    q = torch.randn(1, 6, 2, 8)
    layout = SequenceLayout((6,))
    outputs = {}
    for kernel in ("math", "cpu_flash"):
        strategy = make_strategy("exact", SequenceGroup(ulysses=solo, ring=solo, sp=solo, kernel=kernel))
        outputs[kernel] = strategy.attend(q, q, q, site="s", layout=layout, key_mask=None, scale=None)
    assert torch.allclose(outputs["math"], outputs["cpu_flash"], atol=1e-5)
    strategy = make_strategy("exact", SequenceGroup(ulysses=solo, ring=solo, sp=solo, kernel="unknown"))
    with pytest.raises(ValueError, match="'unknown' is unknown"):
        strategy.attend(q, q, q, site="s", layout=layout, key_mask=None, scale=None)


def test_a_one_process_run_sets_the_kernel_on_the_denoiser(tmp_path):
    results = {}
    for kernel in ("auto", "math"):
        with job_executor(str(tmp_path), attention=kernel) as (world, executor):
            results[kernel] = drive.denoise(executor, job("tiny-wan", num_inference_steps=2), JobTimer(world.ctx.device))
            transformer = executor.model_for(job("tiny-wan")).pipe.transformer
            backends = {str(getattr(module.processor, "_attention_backend", None))
                        for module in transformer.modules() if hasattr(module, "processor")}
        assert backends == ({"None"} if kernel == "auto" else {"AttentionBackendName._NATIVE_MATH"}), (kernel, backends)
    assert float((results["auto"] - results["math"]).abs().max()) <= 1e-4


def test_a_kernel_set_on_one_model_leaves_the_process_default_alone(tmp_path):
    """diffusers' own setter also changes the process-wide backend, which would reach every model built later
    in the process; genbatch sets the kernel on the job's denoiser only."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry.get_active_backend()[0]
    with job_executor(str(tmp_path), attention="math") as (world, executor):
        drive.denoise(executor, job("tiny-wan", num_inference_steps=1), JobTimer(world.ctx.device))
    assert _AttentionBackendRegistry.get_active_backend()[0] == before


def test_gen_run_refuses_a_maskless_kernel_for_a_model_that_masks_text(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-qwen-image", "--attention",
                     "flash", "-q")
    assert result.returncode == 2
    assert "--attention flash takes no key-padding mask" in result.stderr
    assert "--attention cpu-flash works" in result.stderr
