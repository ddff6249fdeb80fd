"""A weight-only fp8 Linear on the CPU that dequantizes its weight a block of rows at a time.

torchao's weight-only fp8 matmul (`Float8WeightOnlyConfig`, what `--quantization fp8` runs on the CPU)
dequantizes the whole weight for each call: an fp32 copy of the fp8 data, an fp32 product with the scales, then
the bf16 weight, about 5 bytes a value at once (140 MB for one 8960 x 1536 FFN matrix). Those temporaries set a
run's peak memory during the denoise, so fp8 saved no memory on the CPU at all where int8 saved 40% of the
transformer's bytes (bench/quantization.py).

`RowBlockLinear` computes the same product a block of output rows at a time: each block is dequantized by
torchao's own `Float8Tensor.dequantize` (the same values, element for element), multiplied, and joined along the
output features. The temporaries are one block's (`BLOCK_VALUES`). Under `torch.compile` it runs torchao's
whole-weight path, which the compiler fuses. A layer takes the class in place (`use_row_blocks`), keeping its
parameters, so LoRA's in-place switches, the recorded bytes and `is_quantized` see the same weight.
"""

from __future__ import annotations

import torch

BLOCK_VALUES = 2**20
"""Values of weight dequantized at once (4 MiB as fp32): large enough that each block's matmul is still a
matrix product, small enough that the temporaries stay below the activations'."""


class RowBlockLinear(torch.nn.Linear):
    """A Linear whose weight is a torchao `Float8Tensor` (weight-only fp8): output features a block at a time."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (torch.nn.Linear's own name)
        weight = self.weight
        if torch.compiler.is_compiling() or weight.numel() <= BLOCK_VALUES:
            return super().forward(input)
        rows = max(1, BLOCK_VALUES // weight.shape[1])
        parts = []
        for start in range(0, weight.shape[0], rows):
            block = weight[start:start + rows].dequantize()  # (rows, in_features) at the weight's own dtype
            bias = None if self.bias is None else self.bias[start:start + rows]
            parts.append(torch.nn.functional.linear(input, block, bias))  # (..., rows)
        return torch.cat(parts, dim=-1)  # (..., out_features)


def use_row_blocks(linear: torch.nn.Linear) -> None:
    """Make `linear` (a plain Linear holding a weight-only fp8 weight) a `RowBlockLinear` in place."""
    if type(linear) is torch.nn.Linear:
        linear.__class__ = RowBlockLinear


__all__ = ["BLOCK_VALUES", "RowBlockLinear", "use_row_blocks"]
