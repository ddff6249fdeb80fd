"""ParallelDims: the run's layout, validated once at start-up, and its one name grammar.

The world is `dp x cfg x distrifusion x pp x ring x ulysses x tp` ranks (`parallel/axes.py`: the axis table,
outermost first, and the rules for combining axes). A *job group* is every axis but `dp`: the ranks that run
one job together; `dp` groups run different jobs side by side. The innermost axes vary fastest, so their ranks
are contiguous and stay inside a node; ring, cfg and dp go across.

A layout's name lists its degrees above one, outermost first, joined by dashes, then `fsdp` when weights are
sharded: `single` (one process), `dp2`, `cfg2-ulysses2`, `dp2-cfg2-ulysses4-fsdp`. `ParallelDims.name` writes
it and `ParallelDims.parse` reads it back, for the runner, `gen plan`, `gen bench --layouts` and the reports.

`ParallelDims` is the one layout type: the runner's and the planner's. `problems()` is the axis table's rule
set (`axes.layout_problems`), which both the runner's start-up and the planner's enumeration apply.
`LayoutRequest` is what `gen run`'s layout flags ask for before the world size is known (`--dp` left out
takes the rest).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from genbatch.parallel.axes import AXES, DEFAULT_FSDP_AXES, GROUP_AXES, SP_AXES, layout_problems

SINGLE = "single"
"""The name of the one-process layout."""
_NAME_PART = re.compile(r"^(" + "|".join(AXES) + r")([1-9][0-9]*)$")


def layout_name(degrees: Mapping[str, int], *, fsdp: bool) -> str:
    """The one layout-name grammar: the degrees above one in the order of `AXES`, then `fsdp`; `single` when
    none. Pure, for any axes (the planner names layouts the runner does not implement yet with it too)."""
    parts = [f"{axis}{degrees.get(axis, 1)}" for axis in AXES if degrees.get(axis, 1) > 1]
    if fsdp:
        parts.append("fsdp")
    return "-".join(parts) or SINGLE


def _check_group_axes(degrees: Mapping[str, int | None]) -> None:
    """ValueError naming the keys of `degrees` that are not job-group axes."""
    unknown = sorted(set(degrees) - set(GROUP_AXES))
    if unknown:
        raise ValueError(f"{unknown}: not job-group axes; the axes are {', '.join(GROUP_AXES)}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelDims:
    dp: int = 1
    """Data-parallel groups: each runs whole jobs on its own."""
    cfg: int = 1
    """CFG parallel degree: 2 runs the conditional and unconditional branches on different ranks."""
    distrifusion: int = 1
    """DistriFusion patches: each rank holds every layer and one patch of the latent, and attends to the other
    patches' K/V of the step before (all-gathered asynchronously). Composes with cfg and dp only."""
    pp: int = 1
    """PipeFusion stages: the layers split over `pp` ranks, patches of the latent streamed through them."""
    ring: int = 1
    """Ring-attention degree: K/V blocks passed around a ring, point to point."""
    ulysses: int = 1
    """Ulysses degree: heads scattered and sequence gathered by all-to-all; must divide the head count."""
    tp: int = 1
    """Tensor-parallel degree: heads and MLP columns split over consecutive ranks; ulysses x tp must divide the
    head count."""
    fsdp: bool = False
    """Shard the transformer's and text encoder's weights over `fsdp_axes` of the job group with FSDP2."""
    fsdp_axes: tuple[str, ...] = DEFAULT_FSDP_AXES
    """The sub-mesh FSDP shards over: by default the job group minus tp and pp."""

    def _product(self, axes: tuple[str, ...]) -> int:
        size = 1
        for axis in axes:
            size *= getattr(self, axis)
        return size

    @property
    def world_size(self) -> int:
        return self._product(AXES)

    @property
    def group_size(self) -> int:
        """Ranks that run one job together."""
        return self._product(GROUP_AXES)

    @property
    def sp(self) -> int:
        """Sequence-parallel degree (ring x ulysses)."""
        return self._product(SP_AXES)

    @property
    def fsdp_size(self) -> int:
        """Ranks each sharded weight is spread over (1 without FSDP)."""
        return self._product(self.fsdp_axes) if self.fsdp else 1

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    def degrees(self) -> dict[str, int]:
        """Every axis's degree by name, in the order of `AXES`."""
        return {axis: getattr(self, axis) for axis in AXES}

    def span(self, axis: str) -> tuple[int, int]:
        """(stride, degree) of `axis` on the mesh: its group's members are `stride` ranks apart."""
        return self._product(AXES[AXES.index(axis) + 1 :]), getattr(self, axis)

    def problems(self, *, cache: bool = False, quantization: str = "none") -> list[str]:
        """Why these degrees cannot run together, whatever the model (`axes.layout_problems`: the rules the
        runner's start-up and the planner's enumeration share); `cache`: with a step cache on; `quantization`:
        the run's `--quantization`."""
        return layout_problems(self.degrees(), fsdp=self.fsdp, cache=cache, quantization=quantization)

    def check(self, *, cache: bool = False, quantization: str = "none") -> None:
        """ValueError naming every problem of `problems()` and its fix."""
        problems = self.problems(cache=cache, quantization=quantization)
        if problems:
            raise ValueError("; ".join(problems))

    def shape(self) -> tuple[int, ...]:
        """The mesh shape, in the order of `AXES`."""
        return tuple(getattr(self, axis) for axis in AXES)

    def describe(self) -> str:
        shown = [axis for axis in AXES if axis not in ("distrifusion", "pp", "tp") or getattr(self, axis) > 1]
        return " x ".join(f"{axis}={getattr(self, axis)}" for axis in shown) + (" +fsdp" if self.fsdp else "")

    @property
    def name(self) -> str:
        """`single`, `dp2`, `cfg2-ulysses2`, `dp2-cfg2-ulysses4-fsdp`, ...: what `parse` reads back."""
        return layout_name(self.degrees(), fsdp=self.fsdp)

    @classmethod
    def parse(cls, name: str) -> "ParallelDims":
        """A layout name (`dp2-cfg2-ulysses4-fsdp`, `single`) -> ParallelDims; ValueError naming the fix. The
        name is read, not judged: a caller that runs the layout calls `check()`."""
        text = name.strip().lower()
        if text in (SINGLE, "1", "one"):
            return cls()
        degrees: dict[str, int | bool] = {}
        for part in text.split("-"):
            if part == "fsdp" and "fsdp" not in degrees:
                degrees["fsdp"] = True
                continue
            match = _NAME_PART.match(part)
            if match is None or match.group(1) in degrees:
                raise ValueError(
                    f"layout {name!r}: cannot read {part!r}; write the degrees above one joined by '-' "
                    f"(axes {', '.join(AXES)}), then 'fsdp' to shard weights: e.g. single, dp2, ulysses2, "
                    "cfg2-ulysses2, dp2-ring2-ulysses2-fsdp"
                )
            degrees[match.group(1)] = int(match.group(2))
        return cls(**degrees)

    @classmethod
    def infer(cls, world_size: int, *, dp: int | None = None, fsdp: bool = False, cache: bool = False,
              quantization: str = "none", **degrees: int) -> "ParallelDims":
        """`gen run`'s layout flags -> ParallelDims, `dp` filled from the world size when it is not given ("dp
        takes the rest"); `degrees`: the job group's axes by name (missing ones 1). ValueError naming the fix: the
        axis table's rules (`problems`, with a step cache on when `cache`, for a run quantized to `quantization`)
        first, then the world size."""
        _check_group_axes(degrees)
        problems = layout_problems({"dp": 1 if dp is None else dp, **degrees}, fsdp=fsdp, cache=cache,
                                   quantization=quantization)
        if problems:
            raise ValueError("; ".join(problems))
        group = math.prod(degrees.values())
        if dp is None:
            if world_size % group:
                given = " x ".join(f"{name} {value}" for name, value in degrees.items() if value > 1)
                raise ValueError(
                    f"{given} = {group} does not divide the world size {world_size}; choose degrees whose "
                    f"product divides {world_size} (group sizes that fit: {_divisors(world_size)})"
                )
            dp = world_size // group
        return cls(dp=dp, fsdp=fsdp, **degrees)

    def validate(self, *, world_size: int, num_heads: int, uses_cfg: bool) -> None:
        """Raise ValueError naming the bad value and a layout that would work."""
        self.check()
        unknown = [axis for axis in self.fsdp_axes if axis not in GROUP_AXES]
        if unknown:
            raise ValueError(f"fsdp_axes {self.fsdp_axes}: {unknown} are not job-group axes ({GROUP_AXES})")
        if self.world_size != world_size:
            fix = (
                f"use --dp {world_size // self.group_size} with these degrees, or leave --dp out to let it take the rest"
                if world_size % self.group_size == 0
                else f"choose degrees whose product divides {world_size} (group sizes that fit: {_divisors(world_size)})"
            )
            raise ValueError(f"{self.describe()} makes {self.world_size} ranks, but the world has {world_size}; {fix}")
        if num_heads % self.ulysses:
            fits = [d for d in _divisors(num_heads) if d <= max(world_size, 1) and world_size % d == 0]
            raise ValueError(
                f"--ulysses {self.ulysses} does not divide the model's {num_heads} attention heads; "
                f"use one of {fits} (and --ring for the rest of the sequence-parallel degree)"
            )
        if num_heads % (self.ulysses * self.tp):
            fits = [d for d in _divisors(num_heads // self.ulysses) if world_size % (d * self.ulysses) == 0]
            raise ValueError(
                f"--ulysses {self.ulysses} x --tp {self.tp} = {self.ulysses * self.tp} does not divide the model's "
                f"{num_heads} attention heads (each tp rank keeps heads/tp, and Ulysses scatters those); with "
                f"--ulysses {self.ulysses} use --tp one of {fits}, or move ranks to --ring or --dp"
            )
        if self.cfg == 2 and not uses_cfg:
            raise ValueError(
                "--cfg 2 needs a model that runs classifier-free guidance (e.g. Wan); this model has one branch "
                "per step: use --cfg 1 and give the ranks to --dp, --ulysses or --ring"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutRequest:
    """What `gen run`'s layout flags ask for, before the world size is known: the job group's degrees, `dp`
    (None: the world size over the group's), and `fsdp`. `resolve` turns it into the run's `ParallelDims`."""

    degrees: Mapping[str, int] = field(default_factory=dict)
    """The job group's degrees above one, by axis name (`parallel/axes.py`); the others are 1."""
    dp: int | None = None
    """Data-parallel groups; None: the rest of the world."""
    fsdp: bool = False
    """Shard the transformer's and text encoders' weights over each job group (FSDP2)."""

    @classmethod
    def of(cls, *, dp: int | None = None, fsdp: bool = False, **degrees: int) -> "LayoutRequest":
        """`LayoutRequest.of(ulysses=2, fsdp=True)`: from the flags' values by axis name (1 or None: unset)."""
        _check_group_axes(degrees)
        return cls(degrees={name: value for name, value in degrees.items() if value is not None and value != 1},
                   dp=dp, fsdp=bool(fsdp))

    @classmethod
    def from_flags(cls, options: Mapping[str, object]) -> "LayoutRequest":
        """From a click command's `layout_options` values (`--dp ... --tp`, `--fsdp`)."""
        return cls.of(dp=options["dp"], fsdp=options["fsdp"], **{axis: options[axis] for axis in GROUP_AXES})

    def resolve(self, world_size: int, *, cache: bool = False, quantization: str = "none") -> ParallelDims:
        """The run's layout on `world_size` processes (`cache`: with a step cache on; `quantization`: the run's
        `--quantization`); ValueError naming the fix."""
        return ParallelDims.infer(world_size, dp=self.dp, fsdp=self.fsdp, cache=cache, quantization=quantization,
                                  **self.degrees)

    def flags(self) -> dict[str, int | bool | None]:
        """Every axis's value as the flags gave it (dp None when left to the rest), then fsdp: run.json's record."""
        return {"dp": self.dp, **{axis: self.degrees.get(axis, 1) for axis in GROUP_AXES}, "fsdp": self.fsdp}
