"""ParallelDims: the run's layout, validated once at start-up.

The world is `dp x cfg x ring x ulysses` ranks. A *job group* is the `cfg x ring x ulysses` ranks that run
one job together; `dp` groups run different jobs side by side. Ulysses is the innermost (fastest-varying)
axis, so its ranks are contiguous and stay inside a node; ring, cfg and dp go across.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("dp", "cfg", "ring", "ulysses")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelDims:
    dp: int = 1
    """Data-parallel groups: each runs whole jobs on its own."""
    cfg: int = 1
    """CFG parallel degree: 2 runs the conditional and unconditional branches on different ranks."""
    ring: int = 1
    """Ring-attention degree: K/V blocks passed around a ring, point to point."""
    ulysses: int = 1
    """Ulysses degree: heads scattered and sequence gathered by all-to-all; must divide the head count."""
    fsdp: bool = False
    """Shard the transformer's and text encoder's weights over the job group with FSDP2."""

    @property
    def world_size(self) -> int:
        return self.dp * self.cfg * self.ring * self.ulysses

    @property
    def group_size(self) -> int:
        """Ranks that run one job together."""
        return self.cfg * self.ring * self.ulysses

    @property
    def sp(self) -> int:
        """Sequence-parallel degree (ring x ulysses)."""
        return self.ring * self.ulysses

    def shape(self) -> tuple[int, int, int, int]:
        return (self.dp, self.cfg, self.ring, self.ulysses)

    def describe(self) -> str:
        parts = [f"{axis}={getattr(self, axis)}" for axis in AXES]
        return " x ".join(parts) + (" +fsdp" if self.fsdp else "")

    @classmethod
    def infer(
        cls,
        world_size: int,
        *,
        dp: int | None = None,
        cfg: int = 1,
        ring: int = 1,
        ulysses: int = 1,
        fsdp: bool = False,
    ) -> "ParallelDims":
        """Fill `dp` from the world size when it is not given ("dp takes the rest")."""
        for name, value in (("cfg", cfg), ("ring", ring), ("ulysses", ulysses)):
            if value < 1:
                raise ValueError(f"--{name} {value} must be at least 1")
        group = cfg * ring * ulysses
        if dp is None:
            if world_size % group:
                raise ValueError(
                    f"cfg {cfg} x ring {ring} x ulysses {ulysses} = {group} does not divide the world size "
                    f"{world_size}; choose degrees whose product divides {world_size} "
                    f"(group sizes that fit: {_divisors(world_size)})"
                )
            dp = world_size // group
        return cls(dp=dp, cfg=cfg, ring=ring, ulysses=ulysses, fsdp=fsdp)

    def validate(self, *, world_size: int, num_heads: int, uses_cfg: bool) -> None:
        """Raise ValueError naming the bad value and a layout that would work."""
        for axis in AXES:
            if getattr(self, axis) < 1:
                raise ValueError(f"{axis}={getattr(self, axis)} must be at least 1")
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
        if self.cfg not in (1, 2):
            raise ValueError(f"--cfg {self.cfg}: CFG parallel splits two branches, so it is 1 or 2")
        if self.cfg == 2 and not uses_cfg:
            raise ValueError(
                "--cfg 2 needs a model that runs classifier-free guidance (e.g. Wan); this model has one branch "
                "per step: use --cfg 1 and give the ranks to --dp, --ulysses or --ring"
            )
