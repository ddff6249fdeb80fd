"""Sequence-parallel attention strategies: how one attention call over a split sequence is computed.

A strategy gets this rank's q, k, v shards (b, s_rank, h, d), the `SequenceLayout` of the call's sequence
and an optional key-padding mask (b, S) bool in SP-rank order (every rank's keys one after the other), and
returns this rank's shard of the output. The model's routing names a strategy per attention module
(`genbatch.parallel.routing.SequenceRouting.strategy`); a run may name one for every module instead.

    exact    Ulysses, Ring or USP by the group's shape: equal to one-process attention

Strategies that attend to stale K/V register here under their own names (`distrifusion` in
`genbatch.parallel.patch.strategies`, `pipefusion` in `genbatch.parallel.pipeline.strategy`) and keep a job's
K/V buffers keyed by branch and by the attention call's place in the forward (the same on every rank); model
code does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.ring import ring_attention
from genbatch.parallel.attention.ulysses import ulysses_attention
from genbatch.parallel.attention.usp import usp_attention


class AttentionStrategy(Protocol):
    name: str

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        site: str,
        layout: SequenceLayout,
        key_mask: torch.Tensor | None,
        scale: float | None,
        streams: tuple[str, ...] = (),
    ) -> torch.Tensor:
        """This rank's shards (b, s_rank, h, d) -> its shard of the attention output (b, s_rank, h, d).
        `streams`: the names of the streams the call's keys come from (read by stale-K/V strategies)."""


StrategyFactory = Callable[[SequenceGroup], AttentionStrategy]
STRATEGIES: dict[str, StrategyFactory] = {}


def register_strategy(name: str) -> Callable[[StrategyFactory], StrategyFactory]:
    """Class decorator: make a strategy available to families and runs under `name`."""

    def register(factory: StrategyFactory) -> StrategyFactory:
        if name in STRATEGIES:
            raise ValueError(f"an attention strategy named {name!r} is already registered")
        STRATEGIES[name] = factory
        return factory

    return register


def make_strategy(name: str, group: SequenceGroup) -> AttentionStrategy:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"no sequence-parallel attention strategy named {name!r}; the strategies are {sorted(STRATEGIES)}"
        ) from None
    return factory(group)


@register_strategy("exact")
class ExactAttention:
    """Ulysses on a 1 x U group, Ring on R x 1, USP on R x U: exact against one-process attention."""

    name = "exact"

    def __init__(self, group: SequenceGroup):
        self.group = group

    def attend(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
        group = self.group
        options = {"scale": scale, "key_mask": key_mask, "backend": group.kernel}
        if group.ring.size == 1:
            return ulysses_attention(q, k, v, group.ulysses, layout, **options)
        if group.ulysses.size == 1:
            return ring_attention(q, k, v, group.ring, layout, **options)
        return usp_attention(q, k, v, group.ulysses, group.ring, layout, **options)
