"""The fit recovers known parameters from steps priced by the same cost model, and holds what it cannot see.

Tolerances: with a profile the cost model is linear in the inverse parameters, so noise-free steps give them
back to float rounding (checked to 1e-6). With 1% multiplicative noise (seeded) only the parameters that carry
a large share of the step time are pinned down: the GEMM rate (most of compute) within 5%, and every step
still predicted within 3% (three standard deviations of the noise); small terms (a cfg exchange of a few
microseconds) are not asserted there, because 1% of the step is more than their whole contribution.
"""

from __future__ import annotations

import numpy as np
import pytest

from genbatch.parallel.dims import ParallelDims
from genbatch.planner.calibrate import Observation, fit, run_means, typical_of_each
from genbatch.planner.cost import core_slowdown, estimate, step_terms
from genbatch.planner.hardware import cpu_cluster, make_cluster
from genbatch.planner.layouts import structural_problems
from genbatch.planner.measurements import StepSample
from genbatch.planner.profile import COLLECTIVE_OF_AXIS, Profile
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.workload import make_workload

TRUTH = Profile(
    name="truth", device="h100", gemm_tflops=600.0, gemm_half_rows=400.0, attention_tflops=250.0,
    layer_overhead_s=150e-6,
    bandwidth_gbs={"nvlink/all_to_all": 180.0, "nvlink/sp_gather": 90.0, "nvlink/p2p": 120.0,
                   "nvlink/cfg_exchange": 60.0},
    latency_s={"nvlink/all_to_all": 20e-6, "nvlink/p2p": 15e-6, "nvlink/sp_gather": 30e-6,
               "nvlink/cfg_exchange": 25e-6},
)
LAYOUTS = ("single", "ulysses2", "ring2", "cfg2", "ulysses4", "ring2-ulysses2", "cfg2-ulysses2", "ulysses8",
           "cfg2-ring2-ulysses2")
WORKLOADS = (("flux.1-dev", (512, 512)), ("flux.1-dev", (1024, 1024)), ("wan2.1-1.3b", (832, 480)),
             ("wan2.1-1.3b", (416, 240)))
PUBLISHED = {"nvlink": (300.0, 10e-6), "gloo": (1.0, 50e-6)}


def _observe(truth: Profile, cluster_for, layouts=LAYOUTS, workloads=WORKLOADS) -> list[Observation]:
    """Steps priced by the cost model under `truth`, with the bytes and collectives it counts."""
    observations = []
    for model, (width, height) in workloads:
        work = make_workload(resolve_shape(model), width=width, height=height)
        for name in layouts:
            layout = ParallelDims.parse(name)
            cluster = cluster_for(layout.world_size)
            if structural_problems(layout, work.shape, work.sequence, work.steps, cluster):
                continue
            cost = estimate(layout, work, cluster, truth)
            keys = {axis: f"{cost.links[axis]}/{COLLECTIVE_OF_AXIS[axis]}" for axis in cost.comm_bytes}
            observations.append(Observation(
                terms=step_terms(layout, work, cluster), seconds=cost.seconds_per_step, label=f"{model} {name}",
                bytes_sent={keys[axis]: value for axis, value in cost.comm_bytes.items() if value},
                messages={keys[axis]: value for axis, value in cost.comm_messages.items() if value},
            ))
    return observations


def _noisy(observations: list[Observation], scale: float) -> list[Observation]:
    rng = np.random.default_rng(0)
    return [Observation(terms=o.terms, bytes_sent=o.bytes_sent, messages=o.messages, label=o.label,
                        seconds=o.seconds * (1 + scale * rng.standard_normal())) for o in observations]


def test_noise_free_steps_give_back_every_parameter():
    observations = _observe(TRUTH, make_cluster)
    assert len(observations) > 20
    result = fit(observations, name="lab", device="h100", published=PUBLISHED)
    profile = result.profile
    assert result.held == {}
    for name in ("gemm_tflops", "gemm_half_rows", "attention_tflops", "layer_overhead_s"):
        assert getattr(profile, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6), name
    assert profile.bandwidth_gbs == pytest.approx(TRUTH.bandwidth_gbs, rel=1e-6)
    assert profile.latency_s == pytest.approx(TRUTH.latency_s, rel=1e-6)
    assert profile.core_sharing is None and profile.fit["steps"] == len(observations)
    assert max(abs(r) for r in result.relative_residuals) < 1e-9


def test_one_percent_noise_keeps_the_dominant_parameters_and_the_predictions():
    observations = _noisy(_observe(TRUTH, make_cluster), 0.01)
    result = fit(observations, name="lab", device="h100", published=PUBLISHED)
    assert result.profile.gemm_tflops == pytest.approx(TRUTH.gemm_tflops, rel=0.05)
    assert max(abs(r) for r in result.relative_residuals) < 0.03


def test_one_gpu_fits_compute_and_fixed_cost_only_and_links_keep_their_figures():
    observations = _observe(TRUTH, make_cluster, layouts=("single",))
    result = fit(observations, name="one", device="h100", published=PUBLISHED)
    assert result.profile.bandwidth_gbs == {} and result.profile.latency_s == {}
    assert result.profile.gemm_tflops == pytest.approx(TRUTH.gemm_tflops, rel=1e-6)
    assert result.profile.layer_overhead_s == pytest.approx(TRUTH.layer_overhead_s, rel=1e-6)
    # four workloads cannot separate three compute parameters and the fixed cost: the rest is held, and said
    assert set(result.held) <= {"gemm_half_rows", "attention_tflops"}


def test_cpu_ranks_sharing_cores_are_found():
    truth = Profile(name="cpu", device="cpu", gemm_tflops=0.2, gemm_half_rows=64.0, attention_tflops=0.08,
                    layer_overhead_s=300e-6, bandwidth_gbs={"gloo/all_to_all": 0.5, "gloo/sp_gather": 0.4,
                                                            "gloo/p2p": 0.6, "gloo/cfg_exchange": 0.3},
                    latency_s={"gloo/all_to_all": 400e-6, "gloo/sp_gather": 300e-6, "gloo/p2p": 200e-6,
                               "gloo/cfg_exchange": 250e-6}, core_sharing=0.35)
    observations = _observe(truth, cpu_cluster)
    result = fit(observations, name="cpu", device="cpu", published=PUBLISHED)
    assert result.profile.core_sharing == pytest.approx(0.35, abs=0.0051)  # the grid's step is 0.005
    assert result.profile.gemm_tflops == pytest.approx(0.2, rel=0.01)


def test_cpu_ranks_beyond_the_cores_time_slice_them_and_the_sharing_is_found():
    truth = Profile(name="cpu", device="cpu", gemm_tflops=0.2, gemm_half_rows=64.0, attention_tflops=0.08,
                    layer_overhead_s=300e-6, bandwidth_gbs={"gloo/all_to_all": 0.5, "gloo/sp_gather": 0.4,
                                                            "gloo/p2p": 0.6, "gloo/cfg_exchange": 0.3},
                    latency_s={"gloo/all_to_all": 400e-6, "gloo/sp_gather": 300e-6, "gloo/p2p": 200e-6,
                               "gloo/cfg_exchange": 250e-6}, core_sharing=0.1, cpu_cores=2)
    observations = _observe(truth, cpu_cluster)  # 1 to 8 ranks on 2 cores
    result = fit(observations, name="cpu", device="cpu", published=PUBLISHED, cpu_cores=2)
    assert result.profile.cpu_cores == 2
    assert result.profile.core_sharing == pytest.approx(0.1, abs=0.0051)
    assert result.profile.gemm_tflops == pytest.approx(0.2, rel=0.01)
    # up to the cores, ranks slow each other by the sharing; beyond them they time-slice the cores
    assert [core_slowdown(0.1, ranks, 2) for ranks in (1, 2, 4, 8)] == pytest.approx([1.0, 1.1, 2.2, 4.4])
    assert core_slowdown(0.1, 4) == pytest.approx(1.3)  # a profile without cores: the sharing term alone


def test_no_steps_is_an_error():
    with pytest.raises(ValueError, match="no measured steps"):
        fit([], name="x", device="h100", published=PUBLISHED)


def _step(run: str, job: str, seconds: float, width: int = 128) -> StepSample:
    return StepSample(run=run, job_id=job, step=1, model="m", layout=ParallelDims.parse("dp2-ulysses2"), ranks=4,
                      device="cpu", width=width, height=width, frames=17, steps=5, seconds=seconds)


def test_a_dp_layout_counts_at_its_groups_mean_and_a_measurement_at_its_middle_run():
    # run a: the two dp groups' equal jobs ran at once, one given more of the cores (mean 0.3); runs b and c: a
    # machine running faster (0.25) and slower (0.35) than in run a
    samples = [_step("a", "clip-0", 0.2), _step("a", "clip-1", 0.4), _step("b", "clip-0", 0.25),
               _step("b", "clip-1", 0.25), _step("c", "clip-0", 0.35), _step("c", "clip-1", 0.35),
               _step("a", "big-0", 0.9, width=192), _step("b", "big-0", 0.7, width=192)]
    means = {(s.run, s.width): s.seconds for s in run_means(samples)}
    assert means == pytest.approx({("a", 128): 0.3, ("b", 128): 0.25, ("c", 128): 0.35, ("a", 192): 0.9,
                                   ("b", 192): 0.7})
    typical = {s.width: (s.run, s.seconds) for s in typical_of_each(samples)}
    # three runs: the middle one; two: the faster (the lower median)
    assert typical[128] == ("a", pytest.approx(0.3)) and typical[192] == ("b", pytest.approx(0.7))
