"""`gen plan`'s layout flags as constraints: which layouts to rank, and the nearest fixes when none runs.

    LayoutConstraints(ulysses=4).admits(ParallelDims(dp=2, ulysses=4))    # True
    LayoutConstraints(ulysses=4, fsdp=False).flags()                      # "--ulysses 4 --no-fsdp"

The flags are `gen run`'s (`genbatch.parallel.flags`), so a constraint names a layout the way a run does.
"""

from __future__ import annotations

from collections.abc import Sequence

from genbatch.parallel.axes import AXES
from genbatch.parallel.dims import ParallelDims


class LayoutConstraints:
    """Degrees a ranked layout must have, by axis name (`parallel/axes.py`); an axis not given is free.
    `fsdp`: True keeps only layouts that shard weights over the job group, False only those that do not."""

    __slots__ = ("_degrees", "fsdp")

    def __init__(self, *, fsdp: bool | None = None, **degrees: int | None):
        unknown = sorted(set(degrees) - set(AXES))
        if unknown:
            raise ValueError(f"{unknown}: not mesh axes; the axes are {', '.join(AXES)}")
        for axis, value in degrees.items():
            if value is not None and value < 1:
                raise ValueError(f"--{axis} {value}: a degree is at least 1")
        self._degrees = {axis: degrees[axis] for axis in AXES if degrees.get(axis) is not None}
        self.fsdp = fsdp

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LayoutConstraints) and self.given == other.given

    def __hash__(self) -> int:
        return hash(tuple(self.given.items()))

    def __repr__(self) -> str:
        return f"LayoutConstraints({', '.join(f'{name}={value!r}' for name, value in self.given.items())})"

    @property
    def given(self) -> dict[str, int | bool]:
        """The constraints set, by flag name, in the order of the mesh axes."""
        return {**self._degrees, **({"fsdp": self.fsdp} if self.fsdp is not None else {})}

    def admits(self, layout: ParallelDims) -> bool:
        return all(getattr(layout, name) == value for name, value in self.given.items())

    def flags(self, names: Sequence[str] | None = None) -> str:
        """`--ulysses 4 --fsdp`: the constraints (or those of `names`) as the flags that set them."""
        given = self.given
        parts = []
        for name in names if names is not None else given:
            value = given[name]
            parts.append(("--fsdp" if value else "--no-fsdp") if name == "fsdp" else f"--{name} {value}")
        return " ".join(parts)

    def without(self, name: str) -> LayoutConstraints:
        """These constraints with `name` left free."""
        values = self.given
        values.pop(name)
        return LayoutConstraints(**values)


def _nearest(values: set[int | bool], wanted: int | bool) -> list[int | bool]:
    """The values closest to `wanted` (by ratio for degrees), best first; at most two."""
    if isinstance(wanted, bool):
        return sorted(values)
    return sorted(values, key=lambda value: (max(value, wanted) / min(value, wanted), value))[:2]


def nearest_fixes(constraints: LayoutConstraints, fitting: Sequence[ParallelDims]) -> list[str]:
    """Changes to the constraints that leave a layout to rank: for each constraint, the nearest values it could
    take with the others kept, from `fitting` (the layouts that run here without constraints); dropping them
    all when no single change does."""
    fixes = []
    for name, wanted in constraints.given.items():
        others = constraints.without(name)
        values = {getattr(layout, name) for layout in fitting if others.admits(layout)}
        for value in _nearest(values, wanted):
            fixes.append(LayoutConstraints(**{**others.given, name: value}).flags())
    if not fixes and fitting:
        fixes.append(f"drop {constraints.flags()}")
    return list(dict.fromkeys(fixes))
