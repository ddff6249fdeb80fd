"""Layouts: every way to factor the GPUs into parallel degrees, where each axis's ranks sit, and which are legal.

Ranks are laid out on one mesh in the order of `AXES`, outermost first, the last axis varying fastest
(consecutive ranks): `dp, cfg, distrifusion, pp, ring, ulysses, tp` (`parallel/axes.py`; `pp` is PipeFusion's
stages, `distrifusion` DistriFusion's patches). So TP and Ulysses stay inside a node, Ring and PipeFusion cross
nodes before them, and the two CFG branches go to different nodes before anything else
(seed 000 §8: "节点内 Ulysses、跨节点 Ring（IB）或 PipeFusion（以太网）；CFG 并行的两组尽量放在两个节点上").
FSDP shards each weight over FSDP's sub-mesh of one job's group (the group minus tp and pp), or not at all.
The layouts enumerated are every factoring the axis table's rules admit (`parallel/axes.layout_problems`, the
runner's own start-up check): so the planner ranks everything the runner runs and nothing it refuses.
A layout is the runner's own `ParallelDims`, named in its one grammar (`ParallelDims.name`):
`dp2-cfg2-ulysses4-fsdp`.
"""

from __future__ import annotations

from genbatch.parallel.axes import AXES, AXIS, GROUP_AXES, STALE_AXES
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.hardware import GPUS_PER_SOCKET, Cluster, Link
from genbatch.planner.shapes import ModelShape

MIN_STALE_STEPS = 10
"""PipeFusion and DistriFusion reuse the previous step's K/V; seed 000 §6 and §11 Q4 rule them out for few-step
models (FLUX.1 schnell, 4 steps: adjacent steps differ too much). The planner allows them from 10 steps (seed 003
runs 20 steps with 1-4 warm-up steps)."""

def is_stale(layout: ParallelDims) -> bool:
    """True when the layout reuses the previous step's K/V (PipeFusion or DistriFusion): approximate, not exact."""
    return any(getattr(layout, axis) > 1 for axis in STALE_AXES)


def token_shards(layout: ParallelDims) -> int:
    """Ranks of one job that each hold a piece of its tokens: the sequence-parallel degree, times DistriFusion's
    patches (each rank's queries; PipeFusion's patches stream through one rank and are not counted)."""
    return layout.sp * layout.distrifusion


def plan_degrees(layout: ParallelDims, decode_mode: str = "parallel") -> dict[str, int]:
    """What a plan reports of a layout: every axis's degree, `fsdp` (the ranks each weight is sharded over: 1,
    or the whole job group) and `vae_parallel` (the ranks that decode a job's VAE: the group when it decodes
    patch-parallel, 1 when its leader decodes alone)."""
    vae = layout.group_size if decode_mode == "parallel" else 1
    return {**layout.degrees(), "fsdp": layout.fsdp_size, "vae_parallel": vae}


def run_flags(layout: ParallelDims) -> tuple[str, ...]:
    """`gen run`'s layout flags for `layout`, each word an item: every job-group axis above one, then `--fsdp`
    (`--dp` is left out: gen run gives it the ranks the other axes leave)."""
    flags: list[str] = []
    for axis in GROUP_AXES:
        if layout.degree(axis) > 1:
            flags += [f"--{axis}", str(layout.degree(axis))]
    return (*flags, *(("--fsdp",) if layout.fsdp else ()))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factorings(gpus: int, axes: tuple[str, ...]) -> list[dict[str, int]]:
    """Every way to write `gpus` as a product of degrees over `axes`, each within its axis's largest degree."""
    if not axes:
        return [{}] if gpus == 1 else []
    largest = AXIS[axes[0]].max_degree or gpus
    return [{axes[0]: degree, **rest} for degree in _divisors(gpus) if degree <= largest
            for rest in _factorings(gpus // degree, axes[1:])]


def enumerate_layouts(gpus: int, *, cache: bool = False, quantization: str = "none") -> list[ParallelDims]:
    """Every factoring of `gpus` into the axes, each with and without FSDP, that the axis table's rules admit
    (`ParallelDims.problems`: what the runner's start-up refuses); `cache`: with a step cache on;
    `quantization`: the run's `--quantization` (no tp or FSDP beside fp8 or int8)."""
    layouts = []
    for degrees in _factorings(gpus, AXES):
        for fsdp in (False, True):
            layout = ParallelDims(fsdp=fsdp, **degrees)
            if not layout.problems(cache=cache, quantization=quantization):
                layouts.append(layout)
    return layouts


def link_for_extent(extent: int, cluster: Cluster) -> Link:
    """The slowest link inside an aligned block of `extent` consecutive ranks."""
    per_node = cluster.gpus_per_node
    if cluster.inter is not None and (extent > per_node or per_node % extent):
        return cluster.inter
    if cluster.cross_socket is not None and extent > min(GPUS_PER_SOCKET, per_node):
        return cluster.cross_socket
    return cluster.intra


def axis_link(layout: ParallelDims, axis: str, cluster: Cluster) -> Link:
    """The slowest link a group of `axis` crosses: its members span stride x degree consecutive ranks."""
    stride, degree = layout.span(axis)
    return link_for_extent(stride * degree, cluster)


def crosses_nodes(layout: ParallelDims, axis: str, cluster: Cluster) -> bool:
    return cluster.inter is not None and axis_link(layout, axis, cluster) is cluster.inter


def structural_problems(layout: ParallelDims, shape: ModelShape, sequence: int, steps: int,
                        cluster: Cluster) -> list[str]:
    """Why a layout cannot run this model here at all (empty when it can); memory is judged by the cost model."""
    problems = []
    heads = shape.num_heads
    if layout.cfg > 1 and not shape.uses_cfg:
        problems.append(f"cfg={layout.cfg} needs a model with classifier-free guidance; {shape.name} runs one "
                        "forward per step (guidance-distilled)")
    if heads % (layout.ulysses * layout.tp):
        split = "ulysses" if layout.tp == 1 else "ulysses x tp"
        problems.append(f"{split}={layout.ulysses * layout.tp} does not divide the {heads} heads of {shape.name}")
    for axis in ("ulysses", "tp"):
        if getattr(layout, axis) > 1 and crosses_nodes(layout, axis, cluster):
            problems.append(f"{axis}={getattr(layout, axis)} would cross nodes ({cluster.gpus_per_node} GPUs a node); "
                            f"keep {axis} inside a node")
    split = {axis: getattr(layout, axis) for axis in ("ulysses", "ring", "distrifusion") if getattr(layout, axis) > 1}
    if split and not shape.sequence_parallel:
        problems.append(f"{', '.join(f'{axis}={degree}' for axis, degree in split.items())} needs sequence-parallel "
                        f"split points, which {shape.name} has none of (use dp, cfg or tp)")
    elif layout.distrifusion > 1 and not shape.patch_parallel:
        problems.append(f"distrifusion={layout.distrifusion} needs patches whose keys can go stale, which {shape.name} "
                        "has none of: its output attends causally to a kept prefix (use ulysses, ring, dp, cfg or tp)")
    if layout.pp > 1 and not shape.pipeline_stages:
        problems.append(f"pp={layout.pp} needs PipeFusion stages, which {shape.name} has none of")
    if layout.pp > shape.num_layers:
        problems.append(f"pp={layout.pp} (PipeFusion stages) exceeds the {shape.num_layers} layers of {shape.name}")
    problems += layout.problems()
    for axis, method in STALE_AXES.items():
        if getattr(layout, axis) > 1 and steps < MIN_STALE_STEPS:
            problems.append(f"{axis} ({method}) reuses the previous step's K/V; {steps} steps are too few (needs "
                            f"{MIN_STALE_STEPS} or more)")
    if token_shards(layout) * layout.pp > sequence:
        problems.append(f"{token_shards(layout) * layout.pp} sequence shards exceed the {sequence} tokens")
    return problems
