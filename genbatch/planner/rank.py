"""Rank the legal layouts for an objective; keep the rejected ones with their reasons.

Throughput (seed 000 §2, §11 Q5): data parallelism always gives more jobs per hour than splitting a job,
so the most data-parallel layout that fits memory (and `max_latency`) wins; among equal dp, more jobs per hour.
Latency: fewest seconds per job. Layouts built on stale activations (PipeFusion, DistriFusion) must beat the
best exact layout by `STALE_MARGIN` to rank above it: seed 000 §6 and §8 keep them off fast links ("NVLink 上不用它
（USP 更好，PipeFusion 有气泡与 stale 误差）"). A DistriFusion layout whose K/V do not fit beside the weights is
rejected with the runner's own check (`stale_fit`), so the planner never ranks a row the runner would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from genbatch.jobs.quantization import Quantization
from genbatch.models.spec import ModelSpec
from genbatch.parallel.axes import layout_problems
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.conditioning import encode_input
from genbatch.planner.constraints import LayoutConstraints, nearest_fixes
from genbatch.planner.cost import Estimate, estimate
from genbatch.planner.fixes import Fix, Overage, memory_fix, overage, quantization_fix
from genbatch.planner.hardware import GIB, GPUS, Cluster, cpu_cluster, make_cluster
from genbatch.planner.layouts import (
    enumerate_layouts,
    is_stale,
    plan_degrees,
    run_flags,
    structural_problems,
)
from genbatch.planner.memory import decode_modes
from genbatch.planner.profile import Profile
from genbatch.planner.shapes import ModelShape, resolve_shape
from genbatch.planner.stale_fit import stale_fit_problem
from genbatch.planner.workload import Workload, make_workload

OBJECTIVES = ("throughput", "latency")
STALE_MARGIN = 0.10
"""How much faster (fraction) a stale-activation layout must be to rank above an exact one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A layout that can run here, with its estimate."""

    layout: ParallelDims
    """The layout (the runner's type)."""
    estimate: Estimate
    """Its cost."""
    jobs_per_hour: float
    """Jobs the whole run finishes per hour (dp groups working side by side)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejection:
    """A layout the planner ruled out."""

    layout: ParallelDims
    """The layout."""
    reasons: tuple[str, ...]
    """Why, each naming the limit it breaks."""
    over: Overage | None = None
    """For a layout too big for memory: the number that broke the limit."""
    fix: Fix | None = None
    """For a layout too big for memory: the change that fits with the fewest seconds per job (None: none does)."""
    quantization_fix: Fix | None = None
    """For a layout too big for memory: the least quantization (`--quantization fp8`, `--quantize-text-encoder`)
    with which the same layout fits (None: none does, or the plan quantizes everything already)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The ranked layouts for one workload on one cluster."""

    work: Workload
    """What one job is."""
    cluster: Cluster
    """The GPUs."""
    objective: str
    """`throughput` or `latency`."""
    max_latency: float | None
    """Seconds per job no layout may exceed, when given."""
    ranked: tuple[Candidate, ...]
    """Legal layouts, best first."""
    rejected: tuple[Rejection, ...]
    """Layouts ruled out, with reasons: first those too big or too slow, then those that cannot run at all."""
    constraints: LayoutConstraints = LayoutConstraints()
    """The layout flags every ranked and rejected layout satisfies (`gen plan --ulysses 4 ...`)."""
    profile: Profile | None = None
    """The calibration profile whose parameters priced the layouts; None: published figures only."""

    @property
    def best(self) -> Candidate:
        """The best layout; ValueError naming the limits when none fits."""
        if self.ranked:
            return self.ranked[0]
        reasons = list(dict.fromkeys(rejection.reasons[0] for rejection in self.rejected))[:3]
        raise ValueError(
            f"no runnable layout for {self.work.describe()} on {self.cluster.gpus} x {self.cluster.gpu.name}: "
            + " | ".join(reasons)
            + " (try more GPUs, a larger --gpu-mem, a smaller size, or a looser --max-latency)"
        )


def rank_key(candidate: Candidate, objective: str) -> tuple:
    """What `rank` sorts by, smallest first: throughput puts data parallel first, then jobs per hour; latency
    seconds per job; a stale-K/V layout counts `STALE_MARGIN` slower; the simpler layout wins a tie."""
    layout, cost = candidate.layout, candidate.estimate
    stale = 1.0 + STALE_MARGIN if is_stale(layout) else 1.0
    simplicity = (layout.fsdp_size, layout.tp, layout.pp, layout.distrifusion, layout.ring, layout.ulysses, layout.cfg)
    if objective == "throughput":
        return (-layout.dp, -candidate.jobs_per_hour / stale, simplicity)
    return (cost.seconds_per_job * stale, -candidate.jobs_per_hour, simplicity)


MORE_GPUS = (2, 4, 8)
"""GPU counts (on one node) `more_gpus` tries when nothing fits on the GPUs given."""


def layout_flags(layout: ParallelDims) -> str:
    """The `gen run` flags of a job group's layout: `--ulysses 2 --fsdp`, `--tp 2`."""
    return " ".join(run_flags(layout)) or "one GPU a job"


def more_gpus(cluster: Cluster, ranked_on) -> str | None:
    """Nothing fits on a one-node `cluster`: the fewest GPUs of its kind on one node (`MORE_GPUS`) on which some
    layout does, and there the fastest that shards the weights with FSDP and the fastest with TP (what a model too
    big for one GPU needs; exact layouts before stale-K/V ones); None when more GPUs do not fit it either.
    `ranked_on(cluster)`: the runnable layouts (`Candidate`s) of a plan on that cluster."""
    if cluster.nodes != 1:
        return None
    for gpus in (count for count in MORE_GPUS if count > cluster.gpus):
        candidates = ranked_on(replace(cluster, gpus=gpus))
        if not candidates:
            continue
        ways = []
        exact = [candidate for candidate in candidates if not is_stale(candidate.layout)] or candidates
        for sharded in (lambda layout: layout.fsdp_size > 1 and layout.tp == 1, lambda layout: layout.tp > 1):
            fitting = [candidate for candidate in exact if sharded(candidate.layout)]
            if fitting:
                best = min(fitting, key=lambda candidate: candidate.estimate.seconds_per_job)
                ways.append(f"{layout_flags(best.layout)} ({best.layout.name}: "
                            f"{best.estimate.memory['total']:.1f} GiB per rank, "
                            f"{best.estimate.seconds_per_job:.1f} s per job)")
        if not ways:
            best = candidates[0]
            ways.append(f"{layout_flags(best.layout)} ({best.layout.name})")
        return f"on {gpus} x {cluster.gpu.name} it fits with {' or '.join(ways)}"
    return None


def rank(work: Workload, cluster: Cluster, *, objective: str = "throughput", max_latency: float | None = None,
         constraints: LayoutConstraints | None = None, profile: Profile | None = None, decode: str = "auto",
         cache: bool = False, wider: bool = True) -> Plan:
    """Enumerate, validate, price and order every layout of `cluster.gpus` for `work`, each decoding its VAE in
    mode `decode` (`auto`: an exact mode that fits, else tiled), `cache`: for a run with a step cache on (which
    no stale-K/V layout runs with); with `constraints`, only the layouts that satisfy
    them (ValueError naming them and the nearest fixes when none of those fits). A layout too big for memory
    names the number that broke the limit and the change that fits with the fewest seconds per job; when nothing
    fits and no change does, where more GPUs would (`more_gpus`, with `wider`)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose throughput or latency")
    if max_latency is not None and max_latency <= 0:
        raise ValueError(f"--max-latency {max_latency} must be positive seconds")
    ranked, rejected, illegal, too_big = [], [], [], []
    legal = []
    quantization = work.quantization.kind
    for layout in enumerate_layouts(cluster.gpus, cache=cache, quantization=quantization):
        problems = structural_problems(layout, work.shape, work.sequence, work.steps, cluster)
        if problems:
            illegal.append(Rejection(layout=layout, reasons=tuple(problems)))
            continue
        # DistriFusion's K/V beside the weights: the runner's own row check, with its numbers
        stale_fit = stale_fit_problem(work.shape, work.width, work.height, work.frames, layout,
                                      cluster.memory_gib * GIB)
        if stale_fit is None:
            legal.append(layout)  # what a memory fix may change a layout into
        else:
            problems.append(stale_fit)
        try:
            cost = estimate(layout, work, cluster, profile, decode)
        except ValueError as error:  # a decode mode this layout cannot run
            illegal.append(Rejection(layout=layout, reasons=(str(error),)))
            continue
        over = overage(cost, cluster)
        if max_latency is not None and cost.seconds_per_job > max_latency:
            problems.append(f"{cost.seconds_per_job:.1f} s per job > --max-latency {max_latency:g} s")
        if over is not None or problems:
            too_big.append((layout, cost, over, problems))
            continue
        ranked.append(Candidate(layout=layout, estimate=cost, jobs_per_hour=layout.dp * 3600 / cost.seconds_per_job))
    fixes, quantized_fixes = {}, {}
    for layout, cost, over, _ in too_big:
        if over is not None:
            fixes[layout] = memory_fix(layout, cost, decode_modes(layout, work), legal, cluster, max_latency,
                                       lambda other, mode: estimate(other, work, cluster, profile, mode), decode)
            quantized_fixes[layout] = quantization_fix(
                layout, work.quantization, cluster, max_latency,
                lambda changed, layout=layout: estimate(layout, replace(work, quantization=changed), cluster, profile,
                                                        decode),
                lambda changed, layout=layout: not layout.problems(cache=cache, quantization=changed.kind))
    more = None
    if wider and not ranked and fixes and not any(fixes.values()):  # no layout of these GPUs fits unquantized
        more = more_gpus(cluster, lambda bigger: rank(work, bigger, objective=objective, max_latency=max_latency,
                                                      profile=profile, decode=decode, cache=cache,
                                                      wider=False).ranked)
    for layout, cost, over, problems in too_big:
        fix, quantized = fixes.get(layout), quantized_fixes.get(layout)
        if over is not None:
            problems.insert(0, over.describe(fix, quantized, more))
        rejected.append(Rejection(layout=layout, reasons=tuple(problems), over=over, fix=fix,
                                  quantization_fix=quantized))
    ranked.sort(key=lambda candidate: rank_key(candidate, objective))
    rejected += illegal
    constraints = constraints or LayoutConstraints()
    if constraints.given:
        kept = [candidate for candidate in ranked if constraints.admits(candidate.layout)]
        if not kept:
            raise ValueError(_unmet(constraints, work, cluster, ranked, rejected))
        ranked = kept
        rejected = [rejection for rejection in rejected if constraints.admits(rejection.layout)]
    return Plan(work=work, cluster=cluster, objective=objective, max_latency=max_latency, ranked=tuple(ranked),
                rejected=tuple(rejected), constraints=constraints, profile=profile)


def _combination_problem(constraints: LayoutConstraints, quantization: str = "none") -> str | None:
    """Why the axis table's rules refuse the constrained axes together (DistriFusion beside an axis it does not
    compose with), which is why no layout was built with them; None when they do not."""
    given = constraints.given
    problems = layout_problems({name: value for name, value in given.items() if name != "fsdp"},
                               fsdp=bool(given.get("fsdp")), quantization=quantization)
    return "; ".join(problems) or None


def _unmet(constraints: LayoutConstraints, work: Workload, cluster: Cluster, ranked: list[Candidate],
           rejected: list[Rejection]) -> str:
    """Why no layout with these flags fits, and the nearest flags with which one does."""
    flags = constraints.flags()
    reasons = list(dict.fromkeys(reason for rejection in rejected if constraints.admits(rejection.layout)
                                 for reason in rejection.reasons))[:3]
    if not reasons:
        reasons = [_combination_problem(constraints, work.quantization.kind)
                   or f"no way to factor {cluster.gpus} GPUs has {flags}"]
    fixes = nearest_fixes(constraints, [candidate.layout for candidate in ranked])
    nearest = f"; nearest that fit: {' | '.join(fixes)}" if fixes else "; no layout fits even without them"
    return (f"no layout with {flags} fits {work.describe()} on {cluster.gpus} x {cluster.gpu.name}: "
            + " | ".join(reasons) + nearest)


def plan(
    model: str | ModelSpec | ModelShape,
    gpus: int,
    *,
    nodes: int = 1,
    interconnect: str | None = None,
    intra_node: str | None = None,
    network_gbps: float | None = None,
    gpu: str = "h100",
    gpu_mem: float | None = None,
    width: int | None = None,
    height: int | None = None,
    frames: int | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    offload_text_encoder: bool = False,
    objective: str = "throughput",
    max_latency: float | None = None,
    constraints: LayoutConstraints | None = None,
    profile: Profile | None = None,
    decode: str = "auto",
    cache: bool = False,
    image: bool | None = None,
    input_size: tuple[int, int] | None = None,
    batch_size: int = 1,
    quantization: Quantization | None = None,
) -> Plan:
    """The ranked plan for a model (published name, preset, pipeline directory, spec or shape) on some GPUs,
    priced with `profile`'s fitted parameters where it has them, the VAE decoded in mode `decode`. `steps` and
    `guidance` are the jobs' (None: the model's); a guidance of 1 or less runs one branch a step (a distilled
    LoRA's recipe), so no layout splits CFG. `image`: whether the jobs start from an image (None: as the model
    does, with one if it takes one), whose VAE encode is priced; `input_size`: an edit model's resized input
    image, (width, height); `batch_size`: rows denoised together in one forward; `quantization`: the weights'
    width (`--quantization`, `--quantize-text-encoder`; None: bf16)."""
    if profile is not None and profile.device in GPUS and profile.device != gpu.lower():
        raise ValueError(f"profile {profile.name!r} was measured on {profile.device}, not {gpu}; "
                         f"plan with --gpu {profile.device}, or calibrate on {gpu}")
    if profile is not None and profile.device == "cpu":  # ranks on one CPU machine, as the profile measured
        if nodes != 1:
            raise ValueError(f"profile {profile.name!r} was measured on one CPU machine; drop --nodes {nodes}")
        cluster = cpu_cluster(gpus)
    else:
        cluster = make_cluster(gpus, nodes=nodes, gpu=gpu, gpu_mem=gpu_mem, interconnect=interconnect,
                               intra_node=intra_node, network_gbps=network_gbps)
    shape = resolve_shape(model)
    if guidance is not None and guidance <= 1.0 and shape.uses_cfg:
        shape = replace(shape, uses_cfg=False)  # one forward a step, as the model runs such a row
    work = workload_for(shape, width=width, height=height, frames=frames, steps=steps,
                        offload_text_encoder=offload_text_encoder, image=image, input_size=input_size,
                        batch_size=batch_size, quantization=quantization)
    return rank(work, cluster, objective=objective, max_latency=max_latency, constraints=constraints, profile=profile,
                decode=decode, cache=cache)


def workload_for(shape: ModelShape, *, width: int | None = None, height: int | None = None,
                 frames: int | None = None, steps: int | None = None, offload_text_encoder: bool = False,
                 image: bool | None = None, input_size: tuple[int, int] | None = None,
                 batch_size: int = 1,
                 quantization: Quantization | None = None) -> Workload:
    """One job of the model of `shape` as `plan` prices it: the model's defaults filling what is not given, the
    VAE encode its image needs (`conditioning.encode_input`), `batch_size` rows a forward. An edit model's jobs
    without an image (`image=False`) attend over the output's tokens alone."""
    if image is False and shape.joins_image_tokens:
        shape = replace(shape, joins_image_tokens=False)
    work = make_workload(shape, width=width, height=height, frames=frames, steps=steps,
                         offload_text_encoder=offload_text_encoder, batch=batch_size, quantization=quantization)
    encode = encode_input(shape, width=work.width, height=work.height, frames=work.frames, image=image,
                          input_size=input_size)
    return replace(work, encode=encode)


def best_layout(model: str | ModelSpec | ModelShape, gpus: int, **options) -> dict[str, int]:
    """The degrees of the best runnable layout: dp, cfg, distrifusion, pp, ring, ulysses, tp, fsdp, vae_parallel
    (the ranks that decode each job: the group when it decodes patch-parallel, else 1).

    Takes `plan`'s keyword options (nodes, interconnect, gpu, gpu_mem, width, height, frames, steps, objective,
    max_latency, decode, ...); raises ValueError naming the limits when nothing fits.
    """
    best = plan(model, gpus, **options).best
    return plan_degrees(best.layout, best.estimate.decode_mode)
