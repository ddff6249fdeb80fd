"""Per-model sequence-parallel facts, as data.

Where a transformer is split and gathered comes from the model's own `_cp_plan` (diffusers' declarative
table: `ContextParallelInput` / `ContextParallelOutput` by module name); what genbatch adds per class is
which attention modules attend over the split sequence, and which split inputs, in which order, make up
that sequence. A model class missing here runs without sequence parallelism (an error names the fix).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class SequencePlan:
    attention: tuple[str, ...]
    """Glob patterns of attention modules whose attention runs over the split sequence (self or joint
    attention). Cross-attention to replicated text needs no communication and is not listed."""
    streams: tuple[str, ...]
    """The split inputs (names in the `_cp_plan`) whose tokens those modules attend over, in the order the
    attention processor concatenates them (joint attention: text stream first, as diffusers does)."""
    output_stream: str = "hidden_states"
    """The stream the plan's gather points bring back to full length."""

    def attention_modules(self, model) -> list[tuple[str, object]]:
        return [
            (name, module)
            for name, module in model.named_modules()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.attention)
        ]


SEQUENCE_PLANS: dict[str, SequencePlan] = {
    # Wan 2.1/2.2: self-attention `attn1` over video tokens; `attn2` cross-attends to replicated text.
    "WanTransformer3DModel": SequencePlan(attention=("blocks.*.attn1",), streams=("hidden_states",)),
    # FLUX.1: joint attention over [text, image] in the double-stream blocks, and over the concatenated
    # stream in the single-stream blocks; both streams are split.
    "FluxTransformer2DModel": SequencePlan(
        attention=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
        streams=("encoder_hidden_states", "hidden_states"),
    ),
}


def sequence_plan(model) -> tuple[SequencePlan, dict]:
    """(genbatch's plan, the model's `_cp_plan`) for a transformer; ValueError naming the fix otherwise."""
    name = type(model).__name__
    plan = SEQUENCE_PLANS.get(name)
    cp_plan = getattr(model, "_cp_plan", None)
    if plan is None or not cp_plan:
        raise ValueError(
            f"{name} has no sequence-parallel plan; run it with --ulysses 1 --ring 1 (use --dp, and --cfg for "
            f"CFG models). Sequence parallel covers {sorted(SEQUENCE_PLANS)}"
        )
    return plan, cp_plan
