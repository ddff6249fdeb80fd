"""Job time of the stale-K/V methods: synchronous warm-up steps, then asynchronous steps (and PipeFusion's bubble).

Both methods start with W exact steps, whose transfers are waited for at once, and then reuse the previous step's
K/V for the other patches, so their transfers hide behind compute. With T the one-device step time, S steps,
P stages and M patches, PipeFusion's job takes (issue formula, seed 003):

    W T + (S - W) T / P + (P - 1) T / (P M)

the last term the pipeline's fill and drain: it is not drained between steps, so it fills once a job. DistriFusion
has no bubble: W synchronous steps, then S - W asynchronous ones. The cost model prices the warm-up and the
asynchronous steps of each layout (`cost.estimate`); these functions put them together.
"""

from __future__ import annotations

from genbatch.parallel.stale import DEFAULT_WARMUP, DISTRIFUSION

PIPEFUSION_WARMUP_STEPS = 1
"""Synchronous steps before PipeFusion may use stale K/V: xDiT's default `--warmup_steps 1` (seed 003: 1-4)."""
DISTRIFUSION_WARMUP_STEPS = DEFAULT_WARMUP[DISTRIFUSION]
"""Synchronous steps before DistriFusion uses stale K/V: the runner's `--warmup-steps` default (distrifuser's 4)."""


def stale_job_seconds(*, warm_step_s: float, step_s: float, steps: int, warmup: int,
                      bubble_steps: float = 0.0) -> float:
    """Seconds of a job's denoise: min(W, S) warm-up steps of `warm_step_s`, the rest of `step_s`, and, when any
    step runs asynchronously, a bubble of `bubble_steps` asynchronous steps (PipeFusion's (P - 1) / M)."""
    if steps < 1 or warmup < 0 or bubble_steps < 0:
        raise ValueError(f"steps {steps}, warm-up steps {warmup} and bubble {bubble_steps}: need steps >= 1 and "
                         "the others >= 0")
    warm = min(warmup, steps)
    bubble = bubble_steps * step_s if steps > warm else 0.0
    return warm * warm_step_s + (steps - warm) * step_s + bubble


def pipefusion_job_seconds(*, warm_step_s: float, step_s: float, steps: int, stages: int, patches: int,
                           warmup: int = PIPEFUSION_WARMUP_STEPS) -> float:
    """PipeFusion's denoise: W T + (S - W) T / P + (P - 1) T / (P M) with `warm_step_s` = T (a synchronous step
    through all stages) and `step_s` = T / P (a stage's share of an asynchronous step)."""
    if stages < 1 or patches < 1:
        raise ValueError(f"PipeFusion with {stages} stages and {patches} patches: both must be at least 1")
    return stale_job_seconds(warm_step_s=warm_step_s, step_s=step_s, steps=steps, warmup=warmup,
                             bubble_steps=(stages - 1) / patches)
