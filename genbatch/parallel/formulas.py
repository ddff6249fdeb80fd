"""Seed 000's communication formulas: the bytes one rank sends per denoising step, by collective kind.

For N tokens of width d (heads x head_dim), e bytes per value, L attention layers, F transformer forwards
per step on this rank (2 with CFG unless the branches are split over the cfg axis), P transformer
parameters, and a group of cfg x ring x ulysses ranks:

| kind             | per step and rank                                  | what                               |
|------------------|----------------------------------------------------|------------------------------------|
| all_to_all       | F L 4 (u-1)/u^2 (N/r) d e                          | Ulysses: q, k, v and the output    |
| p2p              | F L 2 (r-1)/r N (d/u) e                            | Ring: K and V around the ring      |
| cfg_exchange     | the prediction's bytes, once                       | CFG parallel: one exchange         |
| fsdp_all_gather  | F (g-1)/g P e                                      | FSDP: one all-gather of the weights|
| sp_gather        | F (s-1)/s (prediction bytes), s = u r p            | output sequence gather (not in the |
|                  |                                                    | seed's table; counted apart)       |
| tp_all_reduce    | F A 2 (t-1)/t (N/s) d e                            | TP: the row-wise outputs           |

(u, r, t, p: Ulysses, Ring, TP and DistriFusion degrees; s = u r p; g the FSDP group size.) With USP, Ulysses runs on the ring
row's N/r tokens and the ring passes h/u heads, which is where N/r and d/u come from; under TP each rank holds
d/t of every attention width and P/t of the weights, so the Ulysses, Ring and FSDP rows take d/t and P/t.

TP's A is the model's: all-reduces of [N, d] per block summed over the blocks (`TensorSplits.all_reduces_per_forward`,
from the family's `TensorSplits.all_reduces`): seed 000's 2 per layer is the standard case, Wan does 3 (its
cross-attention output too), a FLUX or HunyuanVideo single-stream block 1. A joint block all-reduces its text
tokens with its image tokens. The head-split QK norm's all-reduces (`tp_norm`, (N, 1) values) and the AdaLN
modulation's all-gather (`tp_all_gather`, (B, 6d) a block) are small and counted apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from genbatch.models.base import TensorSplits


@dataclass(frozen=True, kw_only=True, slots=True)
class StepShape:
    tokens: int
    """N: the sequence the attention layers run over."""
    width: int
    """d: heads x head_dim."""
    layers: int
    """L: attention layers per forward that run over the split sequence."""
    parameters: int
    """P: the transformer's parameter count."""
    prediction_values: int
    """Values in one noise prediction (the latent's size)."""
    value_bytes: int = 2
    """e: bytes per value (2 for bf16, 4 for fp32)."""
    all_reduce_tokens: float = 0.0
    """A N: tokens all-reduced by TP per forward, over all blocks (`tp_all_reduce_tokens`; 0 without TP)."""
    weight_bytes: float | None = None
    """Bytes per weight value FSDP all-gathers (None: `value_bytes`; 1 for fp8 or int8 weights)."""


def tp_all_reduce_tokens(splits: TensorSplits, blocks: Mapping[str, int], *, image_tokens: int, text_tokens: int,
                         joint: bool) -> float:
    """Tokens all-reduced per forward: A times the tokens of one all-reduce (image plus text in joint blocks),
    less the text of a last block that all-reduces the image alone (SD3's `context_pre_only`)."""
    tokens = image_tokens + (text_tokens if joint else 0)
    total = splits.all_reduces_per_forward(blocks) * tokens
    if splits.text_free_last_block and splits.all_reduces:
        total -= next(iter(splits.all_reduces.values())) * (tokens - image_tokens)
    return float(total)


def bytes_per_step(shape: StepShape, *, cfg: int, ring: int, ulysses: int, fsdp: bool, uses_cfg: bool,
                   tp: int = 1, patches: int = 1) -> dict[str, float]:
    """Expected bytes this rank sends per step, by ledger kind (kinds that send nothing are left out); `patches`:
    DistriFusion's, whose ranks gather the output like sequence shards. The one implementation of these
    formulas: the planner's cost model prices its bytes with it too (`genbatch.planner.cost`)."""
    u, r, e = ulysses, ring, shape.value_bytes
    forwards = (2 if uses_cfg else 1) // cfg
    n, d, layers = shape.tokens, shape.width / tp, shape.layers
    prediction = shape.prediction_values * e
    expected: dict[str, float] = {}
    if u > 1:
        expected["all_to_all"] = forwards * layers * 4 * (u - 1) / u**2 * (n / r) * d * e
    if r > 1:
        expected["p2p"] = forwards * layers * 2 * (r - 1) / r * n * (d / u) * e
    if cfg > 1:
        expected["cfg_exchange"] = prediction
    group = cfg * r * u
    if fsdp and group > 1:
        weight = e if shape.weight_bytes is None else shape.weight_bytes
        expected["fsdp_all_gather"] = forwards * (group - 1) / group * shape.parameters / tp * weight
    shards = u * r * patches
    if shards > 1:
        expected["sp_gather"] = forwards * (shards - 1) / shards * prediction
    if tp > 1:
        expected["tp_all_reduce"] = forwards * 2 * (tp - 1) / tp * shape.all_reduce_tokens / (u * r) * shape.width * e
    return expected
