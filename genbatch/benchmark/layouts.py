"""The parallel layouts a benchmark suite runs, named the way `gen bench --layouts` spells them.

A layout's name lists its degrees above one, joined by dashes: `single` (one process), `dp2`, `ulysses2`,
`cfg2-ulysses2`, `ring2-fsdp`, ... `parse_layout` reads any such name, so a nightly can run layouts beyond
its suite's list; `Layout.run_args` turns one into `gen run` flags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AXES = ("dp", "cfg", "ring", "ulysses")
SINGLE = "single"
_PART = re.compile(r"^(dp|cfg|ring|ulysses)([1-9][0-9]*)$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One way to lay a run over processes: the degrees `gen run` takes."""

    dp: int = 1
    """Data-parallel groups (each runs whole jobs)."""
    cfg: int = 1
    """CFG-parallel degree: 2 puts the two guidance branches on different ranks."""
    ring: int = 1
    """Ring-attention degree."""
    ulysses: int = 1
    """Ulysses degree (must divide the model's head count)."""
    fsdp: bool = False
    """Shard the transformer and text encoder over each job group."""

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"layout degree {axis}={value!r} must be a whole number >= 1 (e.g. {axis}=2)")

    @property
    def world(self) -> int:
        """Processes the layout needs."""
        return self.dp * self.cfg * self.ring * self.ulysses

    @property
    def name(self) -> str:
        """`single`, `dp2`, `cfg2-ulysses2`, `ring2-fsdp`, ...: what `parse_layout` reads back."""
        parts = [f"{axis}{getattr(self, axis)}" for axis in AXES if getattr(self, axis) > 1]
        if self.fsdp:
            parts.append("fsdp")
        return "-".join(parts) or SINGLE

    def describe(self) -> str:
        """For reports: the name and the process count."""
        count = "1 process" if self.world == 1 else f"{self.world} processes"
        return f"{self.name} ({count})"

    def run_args(self) -> list[str]:
        """The `gen run` flags for this layout (`--nproc` when it needs more than one process)."""
        args = ["--dp", str(self.dp), "--cfg", str(self.cfg), "--ring", str(self.ring), "--ulysses", str(self.ulysses)]
        args.append("--fsdp" if self.fsdp else "--no-fsdp")
        if self.world > 1:
            args += ["--nproc", str(self.world)]
        return args


def parse_layout(name: str) -> Layout:
    """`dp2`, `cfg2-ulysses2`, `ring2-fsdp`, `single`, ... -> Layout; ValueError naming the fix otherwise."""
    text = name.strip().lower()
    if text in (SINGLE, "1", "one"):
        return Layout()
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
    return Layout(**degrees)


def parse_layouts(text: str) -> list[Layout]:
    """A comma-separated list of layout names, in order, without repeats."""
    layouts = [parse_layout(part) for part in text.split(",") if part.strip()]
    if not layouts:
        raise ValueError(f"--layouts {text!r} names no layout; e.g. --layouts single,dp2,ulysses2")
    return list(dict.fromkeys(layouts))


def multi_device_layouts(devices: int, num_heads: int, uses_cfg: bool) -> list[Layout]:
    """The layouts worth timing on `devices` accelerators: one rank, then each way to use all of them."""
    layouts = [Layout()]
    if devices < 2:
        return layouts
    layouts.append(Layout(dp=devices))
    if num_heads % devices == 0:
        layouts.append(Layout(ulysses=devices))
    layouts.append(Layout(ring=devices))
    half = devices // 2
    if uses_cfg and devices % 2 == 0 and num_heads % half == 0:
        layouts.append(Layout(cfg=2, ulysses=half))
    return layouts
