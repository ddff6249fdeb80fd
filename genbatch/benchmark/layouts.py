"""The parallel layouts a benchmark suite runs (`ParallelDims`), named the way `gen bench --layouts` spells them.

A layout's name lists its degrees above one, joined by dashes: `single` (one process), `dp2`, `ulysses2`,
`cfg2-ulysses2`, `ring2-fsdp`, ... `parse_layout` reads any such name, so a nightly can run layouts beyond
its suite's list; `run_args` turns one into `gen run` flags. Whether a layout fits the model (heads, CFG)
is `gen run`'s check, made when the layout runs.
"""

from __future__ import annotations

import re

from genbatch.parallel.dims import AXES, ParallelDims

SINGLE = "single"
_PART = re.compile(r"^(dp|cfg|ring|ulysses)([1-9][0-9]*)$")


def layout_name(dims: ParallelDims) -> str:
    """`single`, `dp2`, `cfg2-ulysses2`, `ring2-fsdp`, ...: what `parse_layout` reads back."""
    parts = [f"{axis}{getattr(dims, axis)}" for axis in AXES if getattr(dims, axis) > 1]
    if dims.fsdp:
        parts.append("fsdp")
    return "-".join(parts) or SINGLE


def describe(dims: ParallelDims) -> str:
    """For progress lines: the name and the process count."""
    count = "1 process" if dims.world_size == 1 else f"{dims.world_size} processes"
    return f"{layout_name(dims)} ({count})"


def run_args(dims: ParallelDims) -> list[str]:
    """The `gen run` flags for this layout (`--nproc` when it needs more than one process)."""
    args = ["--dp", str(dims.dp), "--cfg", str(dims.cfg), "--ring", str(dims.ring), "--ulysses", str(dims.ulysses)]
    args.append("--fsdp" if dims.fsdp else "--no-fsdp")
    if dims.world_size > 1:
        args += ["--nproc", str(dims.world_size)]
    return args


def parse_layout(name: str) -> ParallelDims:
    """`dp2`, `cfg2-ulysses2`, `ring2-fsdp`, `single`, ... -> ParallelDims; ValueError naming the fix otherwise."""
    text = name.strip().lower()
    if text in (SINGLE, "1", "one"):
        return ParallelDims()
    degrees: dict[str, int | bool] = {}
    for part in text.split("-"):
        if part == "fsdp":
            degrees["fsdp"] = True
            continue
        match = _PART.match(part)
        if match is None or match.group(1) in degrees:
            raise ValueError(
                f"layout {name!r}: cannot read {part!r}; write degrees above one joined by '-', "
                "e.g. single, dp2, ulysses2, ring2, cfg2, cfg2-ulysses2, ulysses2-fsdp"
            )
        degrees[match.group(1)] = int(match.group(2))
    return ParallelDims(**degrees)


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
