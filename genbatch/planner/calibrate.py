"""Fit a calibration profile to measured steps, by least squares on the cost model's own terms.

With a profile, the cost model's step time is linear in five kinds of unknowns (see `genbatch.planner.profile`):

    t = slowdown x (L a + (L / rows) b + A c) + F o + sum_k (B_k beta_k + M_k lambda_k)

with L, A the step's linear and attention FLOPs, rows the GEMM rows per rank, F its layer forwards, B_k the
bytes it sent of kind k (measured) in M_k collectives (the cost model's count), and a = 1/gemm rate,
b = gemm_half_rows x a, c = 1/attention rate, o the fixed seconds per layer forward, beta_k = 1/bandwidth,
lambda_k the latency. Each step is weighted by 1/t (relative residuals), so fast
and slow layouts count alike. `slowdown = core_slowdown(core_sharing, ranks, cpu_cores)` (ranks beyond the
run's cores time-slice them; `cpu_cores` from run.json, else this machine's) is found by a grid search around the
linear fit, on CPUs whose runs differ in rank count; there the bytes of `cost.COPY_BOUND_KINDS` are time-sliced
too (B_k x max(1, ranks / cpu_cores)).

What the runs cannot tell apart is not guessed: while the columns are linearly dependent or a fitted value
is not positive, that parameter, or else the next of these, holds, in order: gemm_half_rows at the published
figure; attention at the published ratio to the GEMM rate; latencies at the link's; the fixed cost at the
published figure; bandwidths at the link's. Kinds of one link whose bytes are proportional share one
bandwidth and latency (always, first). The fit says which
were held. So one GPU (no communication) fits compute and the fixed cost, or compute alone.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass, field

import numpy as np

from genbatch.jobs.counts import counted
from genbatch.planner.cost import (
    ATTENTION_EFFICIENCY,
    COPY_BOUND_KINDS,
    GEMM_EFFICIENCY,
    GEMM_HALF_ROWS,
    LAYER_OVERHEAD_S,
    StepTerms,
    core_slowdown,
    estimate,
    step_terms,
    time_slicing,
)
from genbatch.planner.hardware import Cluster, cpu_cluster, make_cluster
from genbatch.planner.measurements import StepSample, read_steps, run_folders
from genbatch.planner.profile import COLLECTIVE_OF_AXIS, Profile
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.workload import make_workload

SHARING_GRID = np.linspace(0.0, 1.0, 201)
"""The core_sharing values tried on a CPU (0: every rank has cores of its own; 1: they share one)."""
RANK_TOLERANCE = 1e-9
"""Relative singular value below which the (column-normalized) design matrix counts as rank deficient."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One measured step as the fit sees it."""

    terms: StepTerms
    """Its FLOPs, rows, layer forwards and ranks."""
    bytes_sent: dict[str, float]
    """Bytes sent, by `LINK/KIND`."""
    messages: dict[str, float] = field(default_factory=dict)
    """Collectives per step, by `LINK/KIND` (the cost model's count for the layout)."""
    seconds: float
    """Measured wall seconds."""
    label: str = ""
    """Where it came from (run folder, layout), for the report."""


@dataclass(kw_only=True, slots=True)
class Fit:
    """A fitted profile and how well it explains the steps it came from."""

    profile: Profile
    """The fitted parameters."""
    relative_residuals: list[float] = field(default_factory=list)
    """(predicted - measured) / measured, one per step."""
    labels: list[str] = field(default_factory=list)
    """Each step's label."""
    held: dict[str, str] = field(default_factory=dict)
    """Parameters the runs could not determine, and what they were held at."""


def observation(sample: StepSample, *, gpu: str = "h100", interconnect: str | None = None) -> Observation:
    """A measured step's cost-model terms: the workload from its model and size, the cluster its run had."""
    work = make_workload(resolve_shape(sample.model), width=sample.width, height=sample.height,
                         frames=sample.frames, steps=sample.steps)
    cluster = measured_cluster(sample.device, sample.ranks, gpu=gpu, interconnect=interconnect)
    modelled = estimate(sample.layout, work, cluster)
    kind_link = {COLLECTIVE_OF_AXIS[axis]: link for axis, link in modelled.links.items()}
    key = {kind: f"{kind_link.get(kind, cluster.intra.name)}/{kind}" for kind in sample.bytes_sent}
    messages = {f"{link}/{COLLECTIVE_OF_AXIS[axis]}": modelled.comm_messages.get(axis, 0.0)
                for axis, link in modelled.links.items()}
    return Observation(terms=step_terms(sample.layout, work, cluster),
                       bytes_sent={key[kind]: value for kind, value in sample.bytes_sent.items() if value},
                       messages={name: count for name, count in messages.items() if name in key.values()},
                       seconds=sample.seconds, label=f"{sample.run} {sample.layout.name} {sample.width}x{sample.height}")


def measured_cluster(device: str, ranks: int, *, gpu: str = "h100", interconnect: str | None = None) -> Cluster:
    """The machine a run was measured on: a CPU under gloo, or `ranks` GPUs of type `gpu` on one node."""
    if device == "cpu":
        return cpu_cluster(ranks)
    return make_cluster(ranks, gpu=gpu, interconnect=interconnect)


@dataclass(slots=True)
class _Design:
    """The least-squares problem: named columns, the right-hand side, and how held parameters were folded."""

    columns: dict[str, np.ndarray]
    rhs: np.ndarray
    published: dict[str, tuple[float, float]]
    """Link name -> (GB/s, seconds per collective) a held bandwidth or latency keeps."""
    held: dict[str, str] = field(default_factory=dict)
    merged: dict[str, list[str]] = field(default_factory=dict)
    """A bandwidth column's name -> the LINK/KIND keys that share it."""


def _design(observations: list[Observation], sharing: float, published: dict[str, tuple[float, float]],
            cores: int | None = None) -> _Design:
    slow = np.array([core_slowdown(sharing, o.terms.ranks, cores) for o in observations])
    slicing = np.array([time_slicing(o.terms.ranks, cores) for o in observations])  # of COPY_BOUND_KINDS' bytes
    linear = np.array([o.terms.linear_flops for o in observations])
    rows = np.array([o.terms.rows for o in observations])
    columns = {
        "gemm": slow * linear,
        "half_rows": slow * linear / rows,
        "attention": slow * np.array([o.terms.attention_flops for o in observations]),
        "overhead": np.array([o.terms.layer_forwards for o in observations], dtype=float),
    }
    design = _Design(columns=columns, rhs=np.array([o.seconds for o in observations]), published=published)
    keys = sorted({key for o in observations for key in o.bytes_sent})
    for key in keys:  # kinds of one link with proportional bytes share a bandwidth and a latency
        column = np.array([o.bytes_sent.get(key, 0.0) for o in observations])
        if key.split("/")[-1] in COPY_BOUND_KINDS:
            column = slicing * column
        count = np.array([o.messages.get(key, 0.0) for o in observations])
        for name, members in design.merged.items():
            other = columns[name]
            same_link = members[0].split("/")[0] == key.split("/")[0]
            if same_link and np.linalg.matrix_rank(np.stack([other / np.linalg.norm(other),
                                                             column / np.linalg.norm(column)]), tol=1e-9) == 1:
                columns[name] = other + column
                columns[f"lat:{name[3:]}"] = columns[f"lat:{name[3:]}"] + count
                members.append(key)
                break
        else:
            design.merged[f"bw:{key}"] = [key]
            columns[f"bw:{key}"], columns[f"lat:{key}"] = column, count
    return design


_HOLD_ORDER = ("half_rows", "attention", "lat:", "overhead", "bw:")
"""What is held first when the columns are dependent (latencies and bandwidths: the last measured kind first)."""


def _hold(design: _Design, name: str | None = None) -> bool:
    """Hold `name` (a parameter that came out not positive) or else the next the runs cannot determine; False
    when none is left to hold (the GEMM rate is always fitted)."""
    columns = design.columns
    latencies = [n for n in reversed(list(columns)) if n.startswith("lat:")]
    if name == "overhead" and latencies:
        name = latencies[0]  # collectives per step grow with layer forwards: latencies give way to the fixed cost
    if name is None or name == "gemm":
        # a GEMM rate that comes out negative competes with the fixed cost: hold that first
        prefixes = ("overhead", *_HOLD_ORDER) if name == "gemm" else _HOLD_ORDER
        order = [n for prefix in prefixes for n in reversed(list(columns)) if n.startswith(prefix)]
        if not order:
            return False
        name = order[0]
    if name == "half_rows":
        columns["gemm"] = columns["gemm"] + GEMM_HALF_ROWS * columns.pop("half_rows")
        design.held["gemm_half_rows"] = f"{GEMM_HALF_ROWS} (published)"
    elif name == "attention":
        ratio = GEMM_EFFICIENCY / ATTENTION_EFFICIENCY  # attention rate / GEMM rate, published
        columns["gemm"] = columns["gemm"] + ratio * columns.pop("attention")
        design.held["attention_tflops"] = f"gemm_tflops x {ATTENTION_EFFICIENCY / GEMM_EFFICIENCY:.3g} (published ratio)"
    elif name == "overhead":
        design.rhs = design.rhs - LAYER_OVERHEAD_S * columns.pop("overhead")
        design.held["layer_overhead_s"] = f"{LAYER_OVERHEAD_S:g} (published)"
    else:
        group = f"bw:{name[4:]}" if name.startswith("lat:") else name
        gbs, latency = design.published.get(design.merged[group][0].split("/")[0], (1.0, 0.0))
        if name.startswith("lat:"):
            design.rhs = design.rhs - latency * columns.pop(name)
            held = ("latency_s", f"{latency:g} (the link's figure)")
        else:
            design.rhs = design.rhs - columns.pop(name) / (gbs * 1e9)
            held = ("bandwidth_gbs", f"{gbs:g} (the link's figure)")
        for key in design.merged[group]:
            design.held[f"{held[0]}[{key}]"] = held[1]
    return True


def _solve(design: _Design) -> tuple[dict[str, float] | None, str | None]:
    """Weighted least squares: (values, None), or (None, the parameter to hold first: None when the columns
    are dependent, else the least positive value's name)."""
    names = list(design.columns)
    weights = 1.0 / np.abs(design.rhs + 1e-30)
    matrix = np.stack([design.columns[name] for name in names], axis=1) * weights[:, None]  # (steps, params)
    norms = np.linalg.norm(matrix, axis=0)
    if np.any(norms == 0):
        return None, names[int(np.argmin(norms))]
    if len(names) > len(design.rhs):
        return None, None
    scaled = matrix / norms
    singular = np.linalg.svd(scaled, compute_uv=False)
    if singular[-1] < RANK_TOLERANCE * singular[0]:
        return None, None
    solution, *_ = np.linalg.lstsq(scaled, design.rhs * weights, rcond=None)
    values = {name: float(value) for name, value in zip(names, solution / norms)}
    worst = min(values, key=values.get)
    return (values, None) if values[worst] > 0 else (None, worst)


def _fit_at(observations: list[Observation], sharing: float, published: dict[str, float], cores: int | None):
    design = _design(observations, sharing, published, cores)
    while True:
        values, culprit = _solve(design)
        if values is not None:
            break
        if not _hold(design, culprit):
            raise ValueError("the measured steps cannot be explained by positive parameters even with all but the "
                             "GEMM rate held; give runs with more steps, layouts or sizes")
    predicted = sum(design.columns[name] * value for name, value in values.items())
    # the right-hand side lost the held terms: compare what the fitted part explains with what it had to
    residuals = (predicted - design.rhs) / np.array([o.seconds for o in observations])
    return values, design, residuals


def fit(observations: list[Observation], *, name: str, device: str, published: dict[str, tuple[float, float]],
        fit_core_sharing: bool | None = None, cpu_cores: int | None = None) -> Fit:
    """Fit a profile to `observations` (see the module docstring); `published` maps link names to the
    (GB/s, seconds per collective) a held bandwidth or latency keeps. `fit_core_sharing` defaults to: a CPU whose
    steps differ in rank count; `cpu_cores`: that CPU's cores (ranks beyond them time-slice, `core_slowdown`)."""
    if not observations:
        raise ValueError("no measured steps to calibrate from")
    if fit_core_sharing is None:
        fit_core_sharing = device == "cpu" and len({o.terms.ranks for o in observations}) > 1
    grid = SHARING_GRID if fit_core_sharing else [None]
    best, error = None, None
    for sharing in grid:
        try:
            values, design, residuals = _fit_at(observations, sharing or 0.0, published,
                                                cpu_cores if fit_core_sharing else None)
        except ValueError as problem:
            error = problem
            continue
        score = float(np.sum(residuals**2))
        if best is None or score < best[0] - 1e-15:
            best = (score, sharing, values, design, residuals)
    if best is None:
        raise error
    _, sharing, values, design, residuals = best
    gemm = 1.0 / values["gemm"]
    attention = 1.0 / values["attention"] if "attention" in values else gemm * ATTENTION_EFFICIENCY / GEMM_EFFICIENCY
    bandwidth = {key: 1.0 / values[group] / 1e9 for group, keys in design.merged.items() if group in values
                 for key in keys}
    latency = {key: values[f"lat:{group[3:]}"] for group, keys in design.merged.items()
               if f"lat:{group[3:]}" in values for key in keys}
    profile = Profile(
        name=name, device=device, gemm_tflops=gemm / 1e12,
        gemm_half_rows=values["half_rows"] * gemm if "half_rows" in values else None,
        attention_tflops=attention / 1e12,
        layer_overhead_s=values.get("overhead"),
        bandwidth_gbs=bandwidth, latency_s=latency, core_sharing=sharing if fit_core_sharing else None,
        cpu_cores=cpu_cores if fit_core_sharing else None,
    )
    profile.fit = {
        "steps": len(observations),
        "rms_relative_residual": float(np.sqrt(np.mean(residuals**2))),
        "max_relative_residual": float(np.max(np.abs(residuals))),
        "held": dict(design.held),
    }
    return Fit(profile=profile, relative_residuals=[float(r) for r in residuals],
               labels=[o.label for o in observations], held=dict(design.held))


def format_fit(result: Fit, path: str | None = None) -> str:
    """The fitted parameters, what was held, and the residuals: what `gen plan --calibrate` prints."""
    profile = result.profile
    jobs = f" (the median step of each of {counted(profile.fit['jobs'], 'job')})" if "jobs" in profile.fit else ""
    if profile.fit.get("measurements", profile.fit.get("jobs")) != profile.fit.get("jobs"):
        jobs = jobs[:-1] + f"; the middle run of each measured in more than one: {profile.fit['measurements']})"
    steps = counted(profile.fit['steps'], 'step')
    lines = [f"calibrated profile {profile.name!r} on {profile.device} from {steps}{jobs}" + (f" -> {path}" if path else "")]
    rows = [("gemm_tflops", profile.gemm_tflops), ("gemm_half_rows", profile.gemm_half_rows),
            ("attention_tflops", profile.attention_tflops), ("layer_overhead_s", profile.layer_overhead_s),
            *((f"bandwidth_gbs[{key}]", value) for key, value in sorted(profile.bandwidth_gbs.items())),
            *((f"latency_s[{key}]", value) for key, value in sorted(profile.latency_s.items())),
            ("core_sharing", profile.core_sharing)]
    for label, value in rows:
        held = result.held.get(label)
        text = f"{value:.4g}" if value is not None else "-"
        lines.append(f"  {label:34s} {text:>12s}  " + (f"held: {held}" if held else "fitted" if value is not None
                                                        else "not measured"))
    if profile.cpu_cores is not None:
        lines.append(f"  {'cpu_cores':34s} {profile.cpu_cores:>12d}  the runs' (ranks beyond them time-slice them)")
    for label, value in sorted(result.held.items()):
        if label.startswith(("bandwidth_gbs", "latency_s")) and label not in dict(rows):
            lines.append(f"  {label:34s} {'-':>12s}  held: {value}")
    residuals = np.array(result.relative_residuals)
    lines.append(f"  residuals (predicted/measured - 1): rms {np.sqrt(np.mean(residuals**2)):.1%}, "
                 f"max {np.max(np.abs(residuals)):.1%} over {len(residuals)} fitted steps")
    by_label: dict[str, list[float]] = {}
    for label, residual in zip(result.labels, result.relative_residuals):
        by_label.setdefault(label, []).append(residual)
    for label, values in by_label.items():
        lines.append(f"    {label}: {np.mean(values):+.1%}" + (f" (mean of {len(values)})" if len(values) > 1 else ""))
    return "\n".join(lines)


def default_profile_name(samples: list[StepSample]) -> str:
    """`DEVICE-MODEL` of the runs (e.g. `cpu-tiny-wan`), a name for `--profile-out` when none is given."""
    models = sorted({sample.model.rstrip("/").split("/")[-1] for sample in samples})
    devices = sorted({sample.device for sample in samples})
    return "-".join(devices + models[:1]).replace(" ", "_")


def calibrate_runs(directories: list[str], *, name: str | None = None, gpu: str = "h100",
                   interconnect: str | None = None) -> Fit:
    """Read the steps `gen run` / `gen bench` wrote under `directories` and fit a profile to them: a CPU's, or
    `gpu`'s when the runs used GPUs (run.json's device). Named `name`, else `default_profile_name`."""
    samples = [sample for directory in directories for run in run_folders(directory) for sample in read_steps(run)]
    devices = sorted({sample.device for sample in samples})
    if len(devices) > 1:
        raise ValueError(f"the runs mix devices ({', '.join(devices)}); calibrate each machine on its own")
    device = "cpu" if devices == ["cpu"] else gpu.lower()
    medians = job_medians(samples)
    typical = typical_of_each(medians)
    observations = [observation(sample, gpu=gpu, interconnect=interconnect) for sample in typical]
    published = {}
    for sample in samples:
        cluster = measured_cluster(sample.device, sample.ranks, gpu=gpu, interconnect=interconnect)
        published.update({link.name: (link.gbs, link.latency_s)
                          for link in (cluster.intra, cluster.cross_socket, cluster.inter) if link})
    cores = sorted({sample.cpu_cores for sample in samples if sample.cpu_cores})
    if len(cores) > 1:
        raise ValueError(f"the runs had different CPU core counts ({', '.join(map(str, cores))}); calibrate each "
                         "machine on its own")
    cpu_cores = cores[0] if cores else (os.cpu_count() if device == "cpu" else None)
    result = fit(observations, name=name or default_profile_name(samples), device=device, published=published,
                 cpu_cores=cpu_cores)
    result.profile.fit.update(steps=len(samples), jobs=len(medians), measurements=len(typical), runs=sorted({sample.run for sample in samples}))
    return result


def job_medians(samples: list[StepSample]) -> list[StepSample]:
    """Each job's median step (the lower middle one), one per (run, job): one slow step (a page fault, a
    neighbour's burst) does not pull the fit."""
    by_job: dict[tuple[str, str], list[StepSample]] = {}
    for sample in samples:
        by_job.setdefault((sample.run, sample.job_id), []).append(sample)
    return [_lower_median(steps) for steps in by_job.values()]


def _measurement(sample: StepSample) -> tuple:
    """What makes two jobs' steps the same measurement: model, layout, ranks, size and steps."""
    return (sample.model, sample.layout, sample.ranks, sample.width, sample.height, sample.frames, sample.steps)


def run_means(medians: list[StepSample]) -> list[StepSample]:
    """One sample per (run, measurement): the mean of a run's equal jobs' median steps. A dp layout's groups run
    their equal jobs at once on one machine; where they share its cores (a CPU), one group's job is faster only
    because the others' got less of the machine, so what the layout runs at is their mean, not their fastest."""
    by_run: dict[tuple, list[StepSample]] = {}
    for sample in medians:
        by_run.setdefault((sample.run, _measurement(sample)), []).append(sample)
    return [dataclasses.replace(group[0], seconds=statistics.fmean(sample.seconds for sample in group))
            for group in by_run.values()]


def typical_of_each(samples: list[StepSample]) -> list[StepSample]:
    """One sample per distinct measurement (model, layout, ranks, size, steps), its middle run (the lower median
    over the runs, each at `run_means`): the same measurement made in more than one run counts once. A shared
    machine's speed moves both ways from minute to minute, a neighbour's burst slows it and a quiet host speeds
    it up (`bench/calibration.py` saw one layout run 1.6x faster in one pass than in the next two), so neither
    the fastest run nor the slowest is the machine's typical speed."""
    runs: dict[tuple, list[StepSample]] = {}
    for sample in run_means(samples):
        runs.setdefault(_measurement(sample), []).append(sample)
    return [_lower_median(group) for group in runs.values()]


def _lower_median(samples: list[StepSample]) -> StepSample:
    """The sample of the lower middle seconds (`statistics.median_low`, keeping the sample)."""
    return sorted(samples, key=lambda sample: sample.seconds)[(len(samples) - 1) // 2]

