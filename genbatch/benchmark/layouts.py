"""The parallel layouts a benchmark suite runs (`ParallelDims`), named the way `gen bench --layouts` spells them.

A layout's name is `ParallelDims.name` (the one grammar of the runner and the reports): its degrees above
one, joined by dashes, `single` for one process: `dp2`, `ulysses2`, `cfg2-ulysses2`, `ring2-fsdp`, ...
`parse_layout` reads any such name, so a nightly can run layouts beyond its suite's list; `run_args` turns
one into `gen run` flags. Whether a layout fits the model (heads, CFG) is `gen run`'s check, made when the
layout runs.
"""

from __future__ import annotations

from genbatch.parallel.axes import AXES
from genbatch.parallel.dims import SINGLE, ParallelDims

__all__ = ["SINGLE", "describe", "layout_name", "multi_device_layouts", "parse_layout", "parse_layouts", "run_args"]


def layout_name(dims: ParallelDims) -> str:
    """`single`, `dp2`, `cfg2-ulysses2`, `ring2-fsdp`, ...: what `parse_layout` reads back."""
    return dims.name


def describe(dims: ParallelDims) -> str:
    """For progress lines: the name and the process count."""
    count = "1 process" if dims.world_size == 1 else f"{dims.world_size} processes"
    return f"{layout_name(dims)} ({count})"


def run_args(dims: ParallelDims) -> list[str]:
    """The `gen run` flags for this layout (`--nproc` when it needs more than one process)."""
    args = [arg for axis in AXES for arg in (f"--{axis}", str(getattr(dims, axis)))]
    args.append("--fsdp" if dims.fsdp else "--no-fsdp")
    if dims.world_size > 1:
        args += ["--nproc", str(dims.world_size)]
    return args


def parse_layout(name: str) -> ParallelDims:
    """`dp2`, `cfg2-ulysses2`, `ring2-fsdp`, `single`, ... -> ParallelDims; ValueError naming the fix otherwise,
    also for axes the axis table's rules do not combine (a benchmark runs its layouts)."""
    dims = ParallelDims.parse(name)
    dims.check()
    return dims


def stale(layout: ParallelDims) -> bool:
    """True for a layout that attends to stale K/V (PipeFusion, DistriFusion): an approximation of exact."""
    return layout.distrifusion > 1 or layout.pp > 1


def parse_layouts(text: str) -> list[ParallelDims]:
    """A comma-separated list of layout names, in order, without repeats."""
    layouts = [parse_layout(part) for part in text.split(",") if part.strip()]
    if not layouts:
        raise ValueError(f"--layouts {text!r} names no layout; e.g. --layouts single,dp2,ulysses2")
    return list(dict.fromkeys(layouts))


def multi_device_layouts(devices: int, num_heads: int, uses_cfg: bool) -> list[ParallelDims]:
    """The layouts worth timing on `devices` accelerators: one rank, then each way to use all of them."""
    layouts = [ParallelDims()]
    if devices < 2:
        return layouts
    layouts.append(ParallelDims(dp=devices))
    if num_heads % devices == 0:
        layouts.append(ParallelDims(ulysses=devices))
    layouts.append(ParallelDims(ring=devices))
    half = devices // 2
    if uses_cfg and devices % 2 == 0 and num_heads % half == 0:
        layouts.append(ParallelDims(cfg=2, ulysses=half))
    return layouts
