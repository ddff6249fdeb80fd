"""Step caching across ranks (gloo, short timeouts): the ranks that share a skipped span's collectives decide
together, on the exact indicator.

Under ulysses 2, tp 2 and ring 2 the agreed First-Block-Cache indicator of every step equals the one-process value
within 1e-5 relative (at `fbc:0`, so no decision near a threshold steers the trajectories apart). A 4-rank
ulysses run with a threshold that skips finishes (no rank waits in an all-to-all another rank skipped), and
every rank writes the same skipped counts. Under CFG parallel the per-step count is summed over the two
branches, the same on every rank; with FSDP the two branches decide jointly."""

from __future__ import annotations

import pytest
import torch

from genbatch.parallel.cache.session import SKIPPED
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

STEPS = 5


def _denoise(out: str, layout: dict, mode: str, steps: int, preset: str) -> dict:
    with job_executor(out, **layout) as (world, executor), drive.hook_summaries() as summaries:
        timer = JobTimer(world.ctx.device)
        latents = drive.denoise(executor, job(preset, num_inference_steps=steps, cache=mode), timer)
        return {"indicators": summaries[-1]["cache_indicators"], "latents": latents,
                "skipped": [row[SKIPPED] for row in timer.rows() if row["stage"] == "denoise_step"]}


def _on_rank(rank, world_size, out, layout, mode, steps, preset):
    return _denoise(f"{out}/rank{rank}", layout, mode, steps, preset)


def _close(ours, reference) -> None:
    assert [(step, branch) for step, branch, _ in ours] == [(step, branch) for step, branch, _ in reference]
    for (_, _, value), (_, _, expected) in zip(ours, reference, strict=True):
        if expected is None:
            assert value is None
        else:
            assert abs(value - expected) <= 1e-5 * abs(expected), (value, expected)


@pytest.mark.parametrize("layout", [  # ring shards the tokens as Ulysses does: the same sums (slow)
    {"ulysses": 2}, {"tp": 2}, pytest.param({"ring": 2}),
], ids=["ulysses2", "tp2", "ring2"])
def test_the_agreed_indicator_equals_one_process(layout, tmp_path):
    reference = _denoise(str(tmp_path / "single"), {}, "fbc:0", STEPS, "tiny-wan")
    results = run_on_ranks(_on_rank, 2, args=(str(tmp_path), layout, "fbc:0", STEPS, "tiny-wan"), timeout_s=30)
    assert len(reference["indicators"]) == 2 * STEPS
    for result in results:
        _close(result["indicators"], reference["indicators"])
        assert result["skipped"] == [0] * STEPS
    assert results[0]["indicators"] == results[1]["indicators"]  # one reduced value, read on every rank


def test_four_ulysses_ranks_skip_together_and_never_hang(tmp_path):
    results = run_on_ranks(_on_rank, 4, args=(str(tmp_path), {"ulysses": 4}, "fbc:0.5", STEPS, "tiny-wan"),
                           timeout_s=20)
    skipped = [result["skipped"] for result in results]
    assert sum(skipped[0]) > 0  # the threshold really skips
    assert all(counts == skipped[0] for counts in skipped)
    assert all(torch.equal(result["latents"], results[0]["latents"]) for result in results)


@pytest.mark.parametrize("fsdp", [pytest.param(False), True],
                         ids=["cfg2-ulysses2", "cfg2-ulysses2-fsdp"])
def test_cfg_branches_count_together_and_decide_jointly_under_fsdp(fsdp, tmp_path):
    layout = {"cfg": 2, "ulysses": 2, "fsdp": fsdp}
    results = run_on_ranks(_on_rank, 4, args=(str(tmp_path), layout, "fbc:0.5", STEPS, "tiny-wan"), timeout_s=30)
    skipped = [result["skipped"] for result in results]
    assert sum(skipped[0]) > 0 and all(counts == skipped[0] for counts in skipped)
    assert all(torch.equal(result["latents"], results[0]["latents"]) for result in results)
    branches = [{branch for _, branch, _ in result["indicators"]} for result in results]
    assert branches == [{"cond"}, {"cond"}, {"uncond"}, {"uncond"}]  # each cfg half runs its own branch
    joint = results[0]["indicators"][1:] == [(s, "cond", v) for s, _, v in results[2]["indicators"][1:]]
    assert joint == fsdp  # under FSDP one decision (one value) for both branches; else each its own
    if fsdp:
        assert all(count in (0, 2) for count in skipped[0])  # both branches skip or neither


@pytest.mark.slow
def test_cfg_branches_with_sequence_and_tensor_parallel_decide_over_their_own_ranks(tmp_path):
    """cfg 2 x ulysses 2 x tp 2 without FSDP: each branch's four ranks agree over a group of their own (built
    at start-up), and the indicators equal one process's branch by branch."""
    reference = _denoise(str(tmp_path / "single"), {}, "fbc:0", 3, "tiny-wan")
    layout = {"cfg": 2, "ulysses": 2, "tp": 2}
    results = run_on_ranks(_on_rank, 8, args=(str(tmp_path), layout, "fbc:0", 3, "tiny-wan"), timeout_s=60)
    for rank, result in enumerate(results):
        branch = "cond" if rank < 4 else "uncond"
        _close(result["indicators"], [entry for entry in reference["indicators"] if entry[1] == branch])
        assert result["skipped"] == [0, 0, 0]
