"""Per-model sequence-parallel facts, as data.

Where a transformer is split and gathered comes from the model's own `_cp_plan` (diffusers' declarative
table: `ContextParallelInput` / `ContextParallelOutput` by module name), or from genbatch's table below for
models diffusers has no plan for (SD3, HunyuanVideo). What genbatch adds per class is which attention modules attend over
the split sequence, and which split streams make up each one's sequence. A split stream is named by the
input it splits (`"hidden_states"`), or by `"<module>:<output index>"` when a module's output is split. A
class missing here runs without sequence parallelism (an error names the fix).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput


@dataclass(frozen=True, kw_only=True, slots=True)
class SequencePlan:
    attention: dict[str, tuple[str, ...]]
    """Glob pattern of attention modules -> the split streams their attention runs over (self or joint
    attention). Cross-attention to replicated text needs no communication and is not listed."""
    output_stream: str = "hidden_states"
    """The stream the plan's gather points bring back to full length."""
    cp_plan: dict = field(default_factory=dict)
    """Split/gather points for a model without its own `_cp_plan` (same format as diffusers'; a key may be
    a glob such as `transformer_blocks.*`, as in diffusers' plans)."""
    strategy: dict[str, str] = field(default_factory=dict)
    """Glob pattern of attention modules -> the attention strategy they use
    (`genbatch.parallel.attention.strategy`); modules not listed use `exact`."""

    def pattern_of(self, module_name: str) -> str:
        """The attention pattern that matches `module_name`."""
        return next(pattern for pattern in self.attention if fnmatch.fnmatchcase(module_name, pattern))

    def attention_modules(self, model) -> list[tuple[str, object, tuple[str, ...], str]]:
        """(name, module, streams, strategy name) of every attention module the plan routes."""
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


_JOINT = ("encoder_hidden_states", "hidden_states")
_SD3_STREAMS = ("pos_embed:0", "context_embedder:0")
_VIDEO_TEXT = ("hidden_states", "encoder_hidden_states")

SEQUENCE_PLANS: dict[str, SequencePlan] = {
    # Wan 2.1/2.2: self-attention `attn1` over video tokens; `attn2` cross-attends to replicated text.
    "WanTransformer3DModel": SequencePlan(attention={"blocks.*.attn1": ("hidden_states",)}),
    # FLUX.1: joint attention over [text, image] in the double- and single-stream blocks; both streams split.
    "FluxTransformer2DModel": SequencePlan(
        attention={"transformer_blocks.*.attn": _JOINT, "single_transformer_blocks.*.attn": _JOINT},
    ),
    # SD3/3.5: image tokens split after patch embedding, text after its projection; joint attention over
    # both, and SD3.5's extra self-attention `attn2` over the image tokens alone.
    "SD3Transformer2DModel": SequencePlan(
        attention={"transformer_blocks.*.attn": _SD3_STREAMS, "transformer_blocks.*.attn2": ("pos_embed:0",)},
        output_stream="pos_embed:0",
        cp_plan={
            "pos_embed": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
            "context_embedder": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        },
    ),
    # Qwen-Image: diffusers' own `_cp_plan` splits both streams at the first block, the text mask and the
    # rotary tables; the joint attention runs over [text, image] with the key-padding mask the processor
    # builds from the split text mask (the local form of `genbatch.parallel.attention.masks`).
    "QwenImageTransformer2DModel": SequencePlan(
        attention={"transformer_blocks.*.attn": ("encoder_hidden_states", "hidden_states")},
    ),
    # HunyuanVideo (diffusers has no plan for it): both streams are split at the first dual-stream block,
    # after the transformer has built its [video, text] key-padding mask over the whole sequence (the full
    # form of the masks), and the video rotary tables with them; joint attention over [video, text] in the
    # dual- and single-stream blocks; the token refiner inside `context_embedder` runs on whole text.
    "HunyuanVideoTransformer3DModel": SequencePlan(
        attention={"transformer_blocks.*.attn": _VIDEO_TEXT, "single_transformer_blocks.*.attn": _VIDEO_TEXT},
        cp_plan={
            "transformer_blocks.0": {
                "hidden_states": ContextParallelInput(split_dim=1, expected_dims=3, split_output=False),
                "encoder_hidden_states": ContextParallelInput(split_dim=1, expected_dims=3, split_output=False),
            },
            "rope": {
                0: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
                1: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
            },
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        },
    ),
}


def sequence_plan(model) -> tuple[SequencePlan, dict]:
    """(genbatch's plan, the split/gather table) for a transformer; ValueError naming the fix otherwise."""
    name = type(model).__name__
    plan = SEQUENCE_PLANS.get(name)
    cp_plan = (plan.cp_plan if plan is not None else None) or getattr(model, "_cp_plan", None)
    if plan is None or not cp_plan:
        raise ValueError(
            f"{name} has no sequence-parallel plan; run it with --ulysses 1 --ring 1 (use --dp, and --cfg for "
            f"CFG models). Sequence parallel covers {sorted(SEQUENCE_PLANS)}"
        )
    return plan, cp_plan
