"""Layouts: every way to factor the GPUs into parallel degrees, where each axis's ranks sit, and which are legal.

Ranks are laid out on one mesh in the order of `AXES`, outermost first, the last axis varying fastest
(consecutive ranks): `dp, cfg, pp, ring, ulysses, tp` (`parallel/axes.py`; `pp` is PipeFusion's stages). So TP and Ulysses stay inside a node, Ring and
PipeFusion cross nodes before them, and the two CFG branches go to different nodes before anything else
(seed 000 §8: "节点内 Ulysses、跨节点 Ring（IB）或 PipeFusion（以太网）；CFG 并行的两组尽量放在两个节点上").
FSDP shards each weight over all ranks of one job's group (cfg x pp x ring x ulysses x tp), or not at all.
A layout is named in the runner's one grammar (`ParallelDims.name`): `dp2-cfg2-ulysses4-fsdp`.
"""

from __future__ import annotations

from dataclasses import dataclass

from genbatch.parallel.axes import AXES, RUNNABLE
from genbatch.parallel.dims import ParallelDims, layout_name
from genbatch.planner.hardware import GPUS_PER_SOCKET, Cluster, Link
from genbatch.planner.shapes import ModelShape

MIN_STALE_STEPS = 10
"""PipeFusion reuses the previous step's K/V; seed 000 §6 and §11 Q4 rule it out for few-step models (FLUX.1
schnell, 4 steps: adjacent steps differ too much). The planner allows it from 10 steps (seed 003 runs 20 steps
with 1-4 warm-up steps)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Parallel degrees for a run; their product (without fsdp) is the number of GPUs."""

    dp: int = 1
    """Data parallel: independent groups, each running its own jobs."""
    cfg: int = 1
    """CFG parallel: 2 puts the conditional and unconditional forwards on different ranks."""
    pp: int = 1
    """PipeFusion stages: layers split into stages, the latent into patches that stream through them."""
    ring: int = 1
    """Ring attention degree (sequence parallel, K/V passed around a ring)."""
    ulysses: int = 1
    """Ulysses degree (sequence parallel, heads exchanged by all-to-all)."""
    tp: int = 1
    """Tensor parallel degree (weights split by heads and MLP columns, two all-reduces a layer)."""
    fsdp: int = 1
    """Ranks each weight is sharded over: 1, or the whole job group."""

    @property
    def group(self) -> int:
        """Ranks that run one job together."""
        return self.cfg * self.pp * self.ring * self.ulysses * self.tp

    @property
    def sp(self) -> int:
        """Sequence-parallel degree (ring x ulysses)."""
        return self.ring * self.ulysses

    @property
    def world(self) -> int:
        return self.dp * self.group

    def degrees(self) -> dict[str, int]:
        """The degrees by name, plus `vae_parallel` (the job group decodes its VAE patch-parallel)."""
        return {**{axis: getattr(self, axis) for axis in AXES}, "fsdp": self.fsdp, "vae_parallel": self.group}

    def parallel_dims(self) -> ParallelDims:
        """The runner's `ParallelDims` for this layout; ValueError for axes the runner does not have."""
        reason = unavailable_reason(self)
        if reason:
            raise ValueError(f"layout {self.name}: {reason}; pick a layout without them")
        return ParallelDims(dp=self.dp, cfg=self.cfg, pp=self.pp, ring=self.ring, ulysses=self.ulysses,
                            tp=self.tp, fsdp=self.fsdp > 1)

    @property
    def name(self) -> str:
        """The layout's name in the runner's grammar (`ParallelDims.name`): `dp2-cfg2-ulysses4-fsdp`."""
        return layout_name({axis: getattr(self, axis) for axis in AXES}, fsdp=self.fsdp > 1)

    def span(self, axis: str) -> tuple[int, int]:
        """(stride, degree) of `axis` on the mesh: its group's members are `stride` ranks apart."""
        stride = 1
        for inner in AXES[AXES.index(axis) + 1 :]:
            stride *= getattr(self, inner)
        return stride, getattr(self, axis)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(gpus: int) -> list[Layout]:
    """Every factoring of `gpus` into the axes (cfg 1 or 2), each with and without FSDP over the job group.

    FSDP is not combined with PipeFusion or TP: those already split the weights (by layer, by column).
    """
    layouts = []
    for cfg in (1, 2):
        if gpus % cfg:
            continue
        for pp in _divisors(gpus // cfg):
            rest = gpus // (cfg * pp)
            for ring in _divisors(rest):
                for ulysses in _divisors(rest // ring):
                    for tp in _divisors(rest // (ring * ulysses)):
                        dp = rest // (ring * ulysses * tp)
                        base = Layout(dp=dp, cfg=cfg, pp=pp, ring=ring, ulysses=ulysses, tp=tp)
                        layouts.append(base)
                        if base.group > 1 and pp == tp == 1:
                            layouts.append(_with_fsdp(base))
    return layouts


def _with_fsdp(layout: Layout) -> Layout:
    return Layout(**{axis: getattr(layout, axis) for axis in AXES}, fsdp=layout.group)


def link_for_extent(extent: int, cluster: Cluster) -> Link:
    """The slowest link inside an aligned block of `extent` consecutive ranks."""
    per_node = cluster.gpus_per_node
    if cluster.inter is not None and (extent > per_node or per_node % extent):
        return cluster.inter
    if cluster.cross_socket is not None and extent > min(GPUS_PER_SOCKET, per_node):
        return cluster.cross_socket
    return cluster.intra


def axis_link(layout: Layout, axis: str, cluster: Cluster) -> Link:
    """The slowest link a group of `axis` crosses: its members span stride x degree consecutive ranks."""
    stride, degree = layout.span(axis)
    return link_for_extent(stride * degree, cluster)


def crosses_nodes(layout: Layout, axis: str, cluster: Cluster) -> bool:
    return cluster.inter is not None and axis_link(layout, axis, cluster) is cluster.inter


def structural_problems(layout: Layout, shape: ModelShape, sequence: int, steps: int, cluster: Cluster) -> list[str]:
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
    if layout.pp > shape.num_layers:
        problems.append(f"pp={layout.pp} (PipeFusion stages) exceeds the {shape.num_layers} layers of {shape.name}")
    if layout.pp > 1 and steps < MIN_STALE_STEPS:
        problems.append(f"pp (PipeFusion) reuses the previous step's K/V; {steps} steps are too few (needs "
                        f"{MIN_STALE_STEPS} or more)")
    if layout.sp * layout.pp > sequence:
        problems.append(f"{layout.sp * layout.pp} sequence shards exceed the {sequence} tokens")
    return problems


def unavailable_reason(layout: Layout) -> str | None:
    """Why genbatch's runner cannot run this layout yet, or None when it can."""
    missing = [axis for axis in AXES if getattr(layout, axis) > 1 and axis not in RUNNABLE]
    if not missing:
        return None
    return " and ".join(missing) + " not in the runner yet (estimate only)"
