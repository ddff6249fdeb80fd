"""The mesh axes, outermost first, and which of them the runner implements (imports nothing heavy).

    dp  x  cfg  x  distrifusion  x  pp  x  ring  x  ulysses  x  tp       (tp varies fastest: consecutive ranks)

`dp` groups run different jobs; the other axes together are one *job group*, the ranks that run one job.
Tensor parallelism is innermost (its two all-reduces a layer want the fastest links, as in xDiT's rank
order), then Ulysses (all-to-all inside a node), then Ring and PipeFusion stages (`pp`), which tolerate slower
links, then DistriFusion's patches, whose K/V all-gathers hide behind a step of compute, then the two CFG branches,
which exchange one prediction a step. FSDP shards weights over a named
sub-mesh: by default the job group without `tp` and `pp` (their ranks hold different weights already).

`RUNNABLE` is the registry the planner and the runner read: any layout can be represented and estimated, but
an axis the runner does not implement yet is rejected at start-up naming it (`check_runnable`), never
silently ignored. An issue that implements an axis flips its entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    name: str
    """The axis's name in the mesh, in layout names (`ulysses4`) and in `gen run --NAME`."""
    what: str
    """One line for messages."""
    runnable: bool
    """True when the runner implements this axis."""


_AXES = (
    Axis(name="dp", what="data parallel: groups that run different jobs", runnable=True),
    Axis(name="cfg", what="CFG parallel: the two guidance branches on different ranks", runnable=True),
    Axis(name="distrifusion", what="DistriFusion: one patch per rank, every layer's K/V all-gathered a step late",
         runnable=True),
    Axis(name="pp", what="PipeFusion stages: layers split into stages, patches streamed through them",
         runnable=True),
    Axis(name="ring", what="Ring attention: K/V blocks passed around a ring", runnable=True),
    Axis(name="ulysses", what="Ulysses: heads exchanged by all-to-all", runnable=True),
    Axis(name="tp", what="tensor parallel: weights split by heads and MLP columns", runnable=True),
)

AXES: tuple[str, ...] = tuple(axis.name for axis in _AXES)
"""Mesh axes, outermost first."""
AXIS: dict[str, Axis] = {axis.name: axis for axis in _AXES}
RUNNABLE: frozenset[str] = frozenset(axis.name for axis in _AXES if axis.runnable)
"""Axes the runner implements: any degree; the others must be 1."""
GROUP_AXES: tuple[str, ...] = AXES[1:]
"""The axes of one job group (every axis but dp)."""
SP_AXES: tuple[str, ...] = ("ring", "ulysses")
"""The sequence-parallel axes (USP: ring outside, ulysses inside)."""
PATCH_AXES: tuple[str, ...] = ("distrifusion",)
"""The axes whose ranks each hold a patch of the latent and attend to the others' stale K/V."""
DEFAULT_FSDP_AXES: tuple[str, ...] = tuple(axis for axis in GROUP_AXES if axis not in ("pp", "tp"))
"""What FSDP shards over by default: the job group minus tp and pp."""


def unrunnable(degrees: Mapping[str, int]) -> tuple[str, ...]:
    """The axes above 1 that the runner does not implement yet, in the order of `AXES`."""
    return tuple(name for name in AXES if degrees.get(name, 1) > 1 and name not in RUNNABLE)


def check_runnable(degrees: Mapping[str, int]) -> None:
    """ValueError naming every axis above 1 that the runner does not implement yet, and what to use instead."""
    missing = unrunnable(degrees)
    if missing:
        named = ", ".join(f"--{name} {degrees[name]} ({AXIS[name].what})" for name in missing)
        usable = ", ".join(f"--{name}" for name in AXES if name in RUNNABLE)
        raise ValueError(f"{named}: not implemented in this version of genbatch; set it to 1 and spread the "
                         f"ranks over {usable} instead (`gen plan` ranks the layouts that run)")
