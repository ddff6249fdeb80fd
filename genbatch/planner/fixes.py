"""A layout too big for memory: the number that broke the limit, and the change that fits with the fewest
seconds per job.

    over = overage(cost, cluster)            # None when the layout fits
    fix = memory_fix(layout, cost, decode_modes(layout, work), legal, cluster, None, price)  # rank() does this
    over.describe(fix)    # "needs 43.90 GiB per rank > 40.00 GiB (weights 23.8, ..., with a tiled decode; weights
                          #  sets the peak); fits with --fsdp (ulysses4-fsdp, tiled decode: 16.2 GiB, 576.6 s per job)"

The changes tried, each from the layout as it is: another decode mode (an exact one, or tiling), FSDP over the
job group, tensor parallel, and more ranks per job (fewer data-parallel groups, the job split over more sequence
ranks, or more DistriFusion patches). Each is priced by the cost model as a layout of its own; the fastest that fits wins.
Beside it, the same layout with quantized weights (`quantization_fix`: `--quantization fp8`, then with
`--quantize-text-encoder` too; only the latter when the plan is quantized already) is named when it fits, so a
rejection says both what another layout and what fp8 weights would do.
An image-conditioned job whose VAE encode sets the peak (`vae_encode`) is fitted the same way: more ranks per
job encode it patch-parallel over more ranks (1/p each), and FSDP or TP leave it more room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from genbatch.jobs.quantization import Quantization
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.cost import Estimate
from genbatch.planner.hardware import Cluster

Price = Callable[[ParallelDims, str], Estimate]
"""Prices a layout with the VAE decoded in a mode (`auto` included)."""

_PARTS = ("weights", "text_encoder", "activations", "vae_decode", "vae_encode")
_PEAKS = ("activations", "vae_decode", "vae_encode")
"""The parts that do not overlap in time: the peak is the resident parts plus the largest of these."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Overage:
    """By how much a layout's peak exceeds the memory per GPU."""

    needs_gib: float
    """The layout's peak per rank, GiB."""
    limit_gib: float
    """The memory per GPU the plan may fill, GiB."""
    part: str
    """The part that sets the peak: `activations`, `vae_decode` or `vae_encode` (whichever is largest), else the
    weights."""
    parts: dict[str, float]
    """GiB per rank by part."""
    decode_mode: str
    """The decode mode the peak was priced with."""

    def describe(self, fix: Fix | None, quantized: Fix | None = None, wider: str | None = None) -> str:
        """The overage, then the layout change that fits (`fix`) and the quantization that fits (`quantized`);
        without either, the way out, and `wider` (where more GPUs fit: `rank.more_gpus`)."""
        detail = ", ".join(f"{name} {self.parts[name]:.1f}" for name in _PARTS
                           if name != "vae_encode" or self.parts.get(name))  # an encode only where a job has one
        text = (f"needs {self.needs_gib:.2f} GiB per rank > {self.limit_gib:.2f} GiB ({detail}, with a "
                f"{self.decode_mode} decode; {self.part} sets the peak)")
        if fix is None and quantized is None:
            return text + "; no change of decode, FSDP, TP, ranks per job or quantization fits on these GPUs: use " \
                          "more GPUs, a larger --gpu-mem or a smaller size" + (f"; {wider}" if wider else "")
        if fix is None:
            return text + f"; fits with {quantized.describe()}" + (f"; or {wider}" if wider else "")
        return text + f"; fits with {fix.describe()}" + (f"; or with {quantized.describe()}" if quantized else "")

    def to_dict(self) -> dict:
        return {"needs_gib": round(self.needs_gib, 3), "limit_gib": round(self.limit_gib, 3), "part": self.part,
                "decode": self.decode_mode}


@dataclass(frozen=True, kw_only=True, slots=True)
class Fix:
    """A change that makes the job fit."""

    change: str
    """The change, as flags: `--vae-decode tiled`, `--fsdp`, `--tp 2`, `--ulysses 8 (2 data-parallel groups)`."""
    layout: ParallelDims
    """The layout after the change."""
    decode_mode: str
    """Its decode mode."""
    seconds_per_job: float
    """Its estimated seconds per job."""
    memory_gib: float
    """Its peak per rank, GiB."""

    def describe(self) -> str:
        return (f"{self.change} ({self.layout.name}, {self.decode_mode} decode: {self.memory_gib:.1f} GiB, "
                f"{self.seconds_per_job:.1f} s per job)")

    def to_dict(self) -> dict:
        return {"change": self.change, "layout": self.layout.name, "decode": self.decode_mode,
                "seconds_per_job": round(self.seconds_per_job, 4), "memory_per_rank_gib": round(self.memory_gib, 3)}


def overage(cost: Estimate, cluster: Cluster) -> Overage | None:
    """How far `cost` is over the cluster's memory per GPU; None when it fits."""
    parts = cost.memory
    if parts["total"] <= cluster.memory_gib:
        return None
    part = max(_PEAKS, key=lambda name: parts.get(name, 0.0))
    if parts["total"] - parts[part] > cluster.memory_gib:  # the resident parts alone break it
        part = max(("weights", "text_encoder"), key=lambda name: parts[name])
    return Overage(needs_gib=parts["total"], limit_gib=cluster.memory_gib, part=part, parts=dict(parts),
                   decode_mode=cost.decode_mode)


def _changes(layout: ParallelDims, cost: Estimate, legal: set[ParallelDims], modes: tuple[str, ...],
             decode: str) -> Iterable[tuple[str, ParallelDims, str]]:
    """(flags, layout, decode mode) for every single change to try; `modes`: the layout's decode modes; `decode`:
    the plan's (what a changed layout decodes in)."""
    for mode in modes:
        if mode != cost.decode_mode:
            yield f"--vae-decode {mode}", layout, mode
    if not layout.fsdp and layout.group_size > 1 and layout.pp == layout.tp == layout.distrifusion == 1:
        yield "--fsdp", replace(layout, fsdp=True), decode
    for factor in (2, 4, 8):
        if layout.dp % factor == 0 and not layout.fsdp:
            yield f"--tp {layout.tp * factor}", replace(layout, dp=layout.dp // factor, tp=layout.tp * factor), decode
    for other in legal:  # the same method: exact stays exact, DistriFusion gets more patches
        same = (other.cfg, other.pp, other.tp, other.fsdp, other.distrifusion > 1) == (
            layout.cfg, layout.pp, layout.tp, layout.fsdp, layout.distrifusion > 1)
        if same and other.group_size > layout.group_size:
            flags = " ".join(f"--{axis} {getattr(other, axis)}" for axis in ("distrifusion", "ring", "ulysses")
                             if getattr(other, axis) != getattr(layout, axis))
            groups = f"{other.dp} data-parallel group" + ("s" if other.dp > 1 else "")
            yield f"{flags} ({groups})", other, decode


def memory_fix(layout: ParallelDims, cost: Estimate, modes: tuple[str, ...], legal: Iterable[ParallelDims],
               cluster: Cluster, max_latency: float | None, price: Price, decode: str = "auto") -> Fix | None:
    """The single change to `layout` (priced in `cost`, able to decode in `modes`) that fits the cluster's memory
    (and `max_latency`) with the fewest seconds per job, a changed layout decoding in the plan's `decode`; None
    when no change does."""
    legal = set(legal)
    best = None
    for change, other, mode in _changes(layout, cost, legal, modes, decode):
        if other not in legal:
            continue
        try:
            priced = price(other, mode)
        except ValueError:  # a decode mode this layout cannot run
            continue
        if overage(priced, cluster) is not None:
            continue
        if max_latency is not None and priced.seconds_per_job > max_latency:
            continue
        if best is None or priced.seconds_per_job < best.seconds_per_job:
            best = Fix(change=change, layout=other, decode_mode=priced.decode_mode,
                       seconds_per_job=priced.seconds_per_job, memory_gib=priced.memory["total"])
    return best


def quantization_changes(current: Quantization) -> list[tuple[str, Quantization]]:
    """The quantizations to try beyond `current`, least change first, with the flags that ask for them."""
    if not current.enabled:
        return [("--quantization fp8", Quantization(kind="fp8")),
                ("--quantization fp8 --quantize-text-encoder", Quantization(kind="fp8", text_encoders=True))]
    if not current.text_encoders:
        return [("--quantize-text-encoder", Quantization(kind=current.kind, text_encoders=True))]
    return []


def quantization_fix(layout: ParallelDims, current: Quantization, cluster: Cluster, max_latency: float | None,
                     price: Callable[[Quantization], Estimate],
                     runs: Callable[[Quantization], bool]) -> Fix | None:
    """The least quantization beyond `current` with which `layout` fits (and `max_latency`): `price` prices the
    layout under a quantization, `runs` says whether the layout runs with it at all (the axis table refuses tp
    and FSDP beside a quantization); None when none fits."""
    for change, quantization in quantization_changes(current):
        if not runs(quantization):
            continue
        try:
            priced = price(quantization)
        except ValueError:
            continue
        if overage(priced, cluster) is not None:
            continue
        if max_latency is not None and priced.seconds_per_job > max_latency:
            continue
        return Fix(change=change, layout=layout, decode_mode=priced.decode_mode,
                   seconds_per_job=priced.seconds_per_job, memory_gib=priced.memory["total"])
    return None


__all__ = ["Fix", "Overage", "memory_fix", "overage", "quantization_fix"]
