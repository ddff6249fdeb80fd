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
| sp_gather        | F (s-1)/s (prediction bytes)                       | output sequence gather (not in the |
|                  |                                                    | seed's table; counted apart)       |

(u, r: Ulysses and Ring degrees; s = u r; g the FSDP group size.) With USP, Ulysses runs on the ring row's
N/r tokens and the ring passes h/u heads, which is where N/r and d/u come from.
"""

from __future__ import annotations

from dataclasses import dataclass


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


def bytes_per_step(shape: StepShape, *, cfg: int, ring: int, ulysses: int, fsdp: bool, uses_cfg: bool) -> dict[str, float]:
    """Expected bytes this rank sends per step, by ledger kind (kinds that send nothing are left out)."""
    u, r, e = ulysses, ring, shape.value_bytes
    forwards = (2 if uses_cfg else 1) // cfg
    n, d, layers = shape.tokens, shape.width, shape.layers
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
        expected["fsdp_all_gather"] = forwards * (group - 1) / group * shape.parameters * e
    if u * r > 1:
        expected["sp_gather"] = forwards * (u * r - 1) / (u * r) * prediction
    return expected
