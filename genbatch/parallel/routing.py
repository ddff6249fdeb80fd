"""Per-model sequence-parallel routing, read from the model families' data (`genbatch.models`).

Where a transformer is split and gathered comes from the model's own `_cp_plan` (diffusers' declarative
table: `ContextParallelInput` / `ContextParallelOutput` by module name), or from its family's split/gather
points for models diffusers has no split points for (SD3, HunyuanVideo). What genbatch adds per class is which
attention modules attend over the split sequence, and which split streams make up each one's sequence (the
family's `AttentionSite`s). A split stream is named by the input it splits (`"hidden_states"`), or by
`"<module>:<output index>"` when a module's output is split. A class no family gives split points runs without
sequence parallelism (an error names the fix).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

from genbatch.models import families
from genbatch.models.base import CROSS, SPLIT_KEYS, Gather, KeptPrefix


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceRouting:
    attention: dict[str, tuple[str, ...]]
    """Glob pattern of attention modules -> the split streams their attention runs over (self or joint
    attention). Cross-attention to replicated text needs no communication and is not listed."""
    output_stream: str = "hidden_states"
    """The stream the gather points bring back to full length."""
    text_streams: tuple[str, ...] = ()
    """The split streams of text tokens (whole in a PipeFusion patch forward)."""
    points: dict = field(default_factory=dict)
    """Split/gather points for a model without its own `_cp_plan` (same format as diffusers'; a key may be
    a glob such as `transformer_blocks.*`, as in diffusers' `_cp_plan`s)."""
    strategy: dict[str, str] = field(default_factory=dict)
    """Glob pattern of attention modules -> the attention strategy they use
    (`genbatch.parallel.attention.strategy`); modules not listed use `exact`."""
    split_keys: tuple[str, ...] = ()
    """Glob patterns of the attention modules whose queries every rank holds whole and whose keys are split
    (`genbatch.models.base.SPLIT_KEYS`): merged over the group on the log-sum-exp, whatever the strategy."""

    kept_prefix: KeptPrefix | None = None
    """A block-causal model's kept prefix (`genbatch.models.base.KeptPrefix`): its blocks' hooks in place of
    `points`."""

    def has_split_keys(self, module_name: str) -> bool:
        """Whether `module_name` is a `SPLIT_KEYS` attention module."""
        return any(fnmatch.fnmatchcase(module_name, pattern) for pattern in self.split_keys)

    def pattern_of(self, module_name: str) -> str:
        """The attention pattern that matches `module_name`."""
        return next(pattern for pattern in self.attention if fnmatch.fnmatchcase(module_name, pattern))

    def attention_modules(self, model) -> list[tuple[str, object, tuple[str, ...], str]]:
        """(name, module, streams, strategy name) of every attention module the routing reaches."""
        found = []
        for name, module in model.named_modules():
            for pattern, streams in self.attention.items():
                if fnmatch.fnmatchcase(name, pattern):
                    chosen = next(
                        (value for glob, value in self.strategy.items() if fnmatch.fnmatchcase(name, glob)), "exact"
                    )
                    found.append((name, module, streams, chosen))
                    break
        return found


def _diffusers_points(points) -> dict:
    """A family's split/gather points (`genbatch.models.base.Split` / `Gather`) in diffusers' `_cp_plan` format."""
    table = {}
    for module, point in points.items():
        if isinstance(point, Gather):
            table[module] = ContextParallelOutput(gather_dim=point.dim, expected_dims=point.expected_dims)
        else:
            table[module] = {
                key: ContextParallelInput(split_dim=split.dim, expected_dims=split.expected_dims,
                                          split_output=split.output)
                for key, split in point.items()
            }
    return table


def _routing() -> dict[str, SequenceRouting]:
    """Every transformer class a model family gives sequence-parallel facts for, by class name."""
    routing = {}
    for family in families().values():
        for class_name, transformer in family.transformers.items():
            if transformer.sequence is None:
                continue
            routing[class_name] = SequenceRouting(
                attention={site.pattern: site.streams for site in transformer.attention if site.kind != CROSS},
                output_stream=transformer.sequence.output_stream,
                text_streams=transformer.sequence.text_streams,
                points=_diffusers_points(transformer.sequence.points),
                strategy=dict(transformer.sequence.strategy),
                split_keys=tuple(site.pattern for site in transformer.attention if site.kind == SPLIT_KEYS),
                kept_prefix=transformer.sequence.kept_prefix,
            )
    return routing


SEQUENCE_ROUTING: dict[str, SequenceRouting] = _routing()
"""Transformer class name -> its routing, from the model families (`TransformerParts.sequence`)."""


def sequence_routing(model) -> tuple[SequenceRouting, dict]:
    """(genbatch's routing, the split/gather table) for a transformer; ValueError naming the fix otherwise."""
    name = type(model).__name__
    routing = SEQUENCE_ROUTING.get(name)
    if routing is not None and routing.kept_prefix is not None:
        return routing, {}  # its hooks take the place of split points
    points = (routing.points if routing is not None else None) or getattr(model, "_cp_plan", None)
    if routing is None or not points:
        raise ValueError(
            f"{name} has no sequence-parallel split points; run it with --ulysses 1 --ring 1 (use --dp, and --cfg for "
            f"CFG models). Sequence parallel covers {sorted(SEQUENCE_ROUTING)}"
        )
    return routing, points
