"""TeaCache: the covered models, the mechanism on tiny models, and its agreement across ranks.

The tiny presets have no published coefficients, so the mechanism runs on them under a coefficient set added
for the test alone (`_tiny_coefficients`: the identity polynomial, one warm-up step); outside it they are
refused. `teacache:0` equals the uncached latents bit for bit; a threshold that skips counts the skipped
branch forwards and always computes the warm-up and last steps, each guidance branch accumulating on its own.
Under ulysses 2 the indicator equals one process's within 1e-5 relative (tiny-flux: its modulated input is
this rank's shard of tokens), 4 ulysses ranks that skip finish with identical flags, and under `--compile` the
hooks wrap the compiled blocks (no graph break, the eager skips and latents)."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest
import torch

from genbatch.models import teacache
from genbatch.models.teacache import COVERED, TeaCacheModel, covered_model
from genbatch.parallel.cache.session import SKIPPED
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 6
WAN_1_3B = {"num_layers": 30, "num_attention_heads": 12, "attention_head_dim": 128, "ffn_dim": 8960,
            "in_channels": 16, "out_channels": 16, "image_dim": None, "text_dim": 4096}
FLUX_DEV = {"num_layers": 19, "num_single_layers": 38, "num_attention_heads": 24, "attention_head_dim": 128,
            "in_channels": 64, "guidance_embeds": True}


def _tiny_coefficients():
    """TeaCache covers tiny-wan and tiny-flux for the duration (identity rescaling, one warm-up step)."""
    tiny = tuple(TeaCacheModel(name=f"{transformer} (test coefficients)", transformer=transformer, config=(),
                               coefficients=(0.0, 0.0, 0.0, 1.0, 0.0), warmup_steps=1)
                 for transformer in ("WanTransformer3DModel", "FluxTransformer2DModel"))
    return mock.patch.object(teacache, "COVERED", COVERED + tiny)


def _denoise(out: str, layout: dict, mode: str, steps: int, preset: str) -> dict:
    with _tiny_coefficients() if mode != "none" else contextlib.nullcontext(), \
            job_executor(out, **layout) as (world, executor), drive.hook_summaries() as summaries:
        timer = JobTimer(world.ctx.device)
        latents = drive.denoise(executor, job(preset, num_inference_steps=steps, cache=mode), timer)
        return {"indicators": summaries[-1].get("cache_indicators", []), "latents": latents,
                "skipped": [row.get(SKIPPED) for row in timer.rows() if row["stage"] == "denoise_step"]}


def _on_rank(rank, world_size, out, layout, mode, steps, preset):
    return _denoise(f"{out}/rank{rank}", layout, mode, steps, preset)


def test_the_covered_models_are_recognised_by_their_transformer_config():
    assert covered_model("WanTransformer3DModel", WAN_1_3B).name == "Wan 2.1 T2V 1.3B"
    assert covered_model("FluxTransformer2DModel", FLUX_DEV).name == "FLUX.1-dev"
    assert covered_model("WanTransformer3DModel", WAN_1_3B, experts=2) is None  # Wan 2.2's two experts
    assert covered_model("WanTransformer3DModel", {**WAN_1_3B, "image_dim": 1280}) is None  # Wan 2.1 I2V
    assert covered_model("FluxTransformer2DModel", {**FLUX_DEV, "guidance_embeds": False}) is None  # schnell
    assert covered_model("WanTransformer3DModel", {"num_layers": 2}) is None  # tiny-wan
    for model in COVERED:
        assert len(model.coefficients) == 5  # degree 4
        for change in (0.0, 0.03, 0.2):
            assert model.rescale(change) == pytest.approx(np.poly1d(model.coefficients)(change), rel=1e-12)


@pytest.mark.parametrize("preset", ["tiny-wan", "tiny-flux"])
def test_threshold_0_equals_no_cache_and_a_threshold_skips_after_the_warm_up(preset, tmp_path):
    exact = _denoise(str(tmp_path / "exact"), {}, "none", STEPS, preset)
    same = _denoise(str(tmp_path / "zero"), {}, "teacache:0", STEPS, preset)
    assert same["skipped"] == [0] * STEPS
    assert torch.equal(same["latents"], exact["latents"])
    skipping = _denoise(str(tmp_path / "skip"), {}, "teacache:2", STEPS, preset)
    branches = 2 if preset == "tiny-wan" else 1  # Wan's cond and uncond; FLUX's guidance is distilled
    assert skipping["skipped"][0] == 0 and skipping["skipped"][-1] == 0  # warm-up and last step compute
    assert sum(skipping["skipped"]) > 0 and max(skipping["skipped"]) <= branches
    assert torch.isfinite(skipping["latents"]).all() and not torch.equal(skipping["latents"], exact["latents"])
    by_branch = {}
    for step, branch, value in skipping["indicators"]:
        by_branch.setdefault(branch, []).append((step, value))
    assert len(by_branch) == branches
    for values in by_branch.values():  # each branch: warm-up and last step compare nothing; the sum grows
        assert values[0][1] is None and values[-1][1] is None
        totals = [value for _, value in values[1:-1]]
        assert totals == sorted(totals) and totals[0] > 0


def test_a_model_without_published_coefficients_is_refused_when_its_job_starts(tmp_path):
    with job_executor(str(tmp_path)) as (world, executor), pytest.raises(ValueError, match="TeaCache covers"):
        drive.denoise(executor, job("tiny-wan", num_inference_steps=2, cache="teacache:0.2"), JobTimer(world.ctx.device))


def test_under_ulysses_2_the_indicator_equals_one_process(tmp_path):
    reference = _denoise(str(tmp_path / "single"), {}, "teacache:0", STEPS, "tiny-flux")
    results = run_on_ranks(_on_rank, 2, args=(str(tmp_path), {"ulysses": 2}, "teacache:0", STEPS, "tiny-flux"),
                           timeout_s=30)
    expected = reference["indicators"]
    assert len(expected) == STEPS and sum(value is not None for _, _, value in expected) == STEPS - 2
    for result in results:
        assert [entry[:2] for entry in result["indicators"]] == [entry[:2] for entry in expected]
        for (_, _, value), (_, _, wanted) in zip(result["indicators"], expected, strict=True):
            assert (value is None) == (wanted is None)
            if wanted is not None:
                assert abs(value - wanted) <= 1e-5 * abs(wanted), (value, wanted)
    assert results[0]["indicators"] == results[1]["indicators"]  # one reduced value, read on every rank


def test_four_ulysses_ranks_skip_together_and_never_hang(tmp_path):
    results = run_on_ranks(_on_rank, 4, args=(str(tmp_path), {"ulysses": 4}, "teacache:2", STEPS, "tiny-wan"),
                           timeout_s=30)
    skipped = [result["skipped"] for result in results]
    assert sum(skipped[0]) > 0  # the threshold really skips
    assert all(counts == skipped[0] for counts in skipped)
    assert all(result["indicators"] == results[0]["indicators"] for result in results)
    assert all(torch.equal(result["latents"], results[0]["latents"]) for result in results)


def _pipeline_directory(path, transformer: str, config: dict, second_expert: bool = False):
    import json

    (path / "transformer").mkdir(parents=True)
    index = {"transformer": ["diffusers", transformer],
             "transformer_2": ["diffusers", transformer] if second_expert else [None, None]}
    (path / "model_index.json").write_text(json.dumps(index))
    (path / "transformer" / "config.json").write_text(json.dumps({"_class_name": transformer, **config}))
    return str(path)


def test_the_start_up_check_reads_a_pipeline_directory_config(tmp_path):
    import dataclasses

    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests.preflight import RunOptionError, check_cache
    from genbatch.models import resolve_model

    overrides = JobOverrides(cache="teacache:0.2")
    flux = dataclasses.replace(resolve_model("tiny-flux"), name="flux-dev",
                               path=_pipeline_directory(tmp_path / "flux", "FluxTransformer2DModel", FLUX_DEV))
    check_cache(flux, overrides)  # covered: nothing raised
    wan22 = dataclasses.replace(resolve_model("tiny-wan"), name="wan-2.2",
                                path=_pipeline_directory(tmp_path / "wan", "WanTransformer3DModel", WAN_1_3B, True))
    check_cache(wan22, JobOverrides(cache="fbc:0.1"))  # other modes are not TeaCache's to check
    with pytest.raises(RunOptionError, match="wan-2.2 has none; TeaCache covers Wan 2.1 T2V 1.3B"):
        check_cache(wan22, overrides)


def test_teacache_hooks_sit_outside_the_compiled_blocks(tmp_path):
    """Under --compile (aot_eager) the same steps skip as eagerly, with no graph break, and the latents agree."""
    from torch._dynamo.utils import counters

    eager = _denoise(str(tmp_path / "eager"), {}, "teacache:2", 4, "tiny-wan")
    torch._dynamo.reset()
    counters.clear()
    compiled = _denoise(str(tmp_path / "compiled"), {"compile": True, "compile_backend": "aot_eager"}, "teacache:2",
                        4, "tiny-wan")
    assert sum(compiled["skipped"]) > 0 and compiled["skipped"] == eager["skipped"]
    assert sum(counters["graph_break"].values()) == 0
    assert (compiled["latents"] - eager["latents"]).abs().max().item() <= 1e-4
