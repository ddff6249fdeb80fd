"""The run's weight quantization as `--quantization` and `--quantize-text-encoder` give it: parsed, checked, and
the widths the planner prices weights at. Pure values (no torch): `genbatch.parallel.quantize` quantizes the
loaded modules, the axis table refuses the layouts it cannot run with (`parallel/axes.layout_problems`), and
the planner prices its bytes (`planner/memory.py`) and its GEMMs (`planner/cost.py`).

    none   the weights in the run's dtype (the default)
    fp8    e4m3 weights, one scale per output row: on GPUs with FP8 GEMMs (compute capability 8.9 or more) the
           activations are scaled to FP8 as they come and the matmuls run on the FP8 tensor cores; elsewhere
           (older GPUs, the CPU) the weights are dequantized into each matmul: half the memory, not faster
    int8   int8 weights, one scale per output row, dequantized into each matmul (weight-only)
"""

from __future__ import annotations

from dataclasses import dataclass

NONE = "none"
QUANTIZATIONS = (NONE, "fp8", "int8")
"""`--quantization`'s values."""
WEIGHT_BYTES = {"fp8": 1, "int8": 1}
"""Bytes a quantized weight value takes, by quantization (its per-row scales, 2-4 bytes a row, are under 0.1% of
a DiT's layers and are left out)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Quantization:
    """What a run quantizes: the width of the transformers' Linear layers, and whether the text encoders' too."""

    kind: str = NONE
    """none, fp8 or int8 (`QUANTIZATIONS`)."""
    text_encoders: bool = False
    """Quantize the text encoders' Linear layers too (`--quantize-text-encoder`)."""

    def __post_init__(self) -> None:
        if self.kind not in QUANTIZATIONS:
            raise ValueError(f"--quantization {self.kind!r}: choose one of {', '.join(QUANTIZATIONS)}")
        if self.text_encoders and self.kind == NONE:
            raise ValueError("--quantize-text-encoder quantizes the text encoders to --quantization's width: add "
                             "--quantization fp8 or int8, or drop --quantize-text-encoder")

    @property
    def enabled(self) -> bool:
        return self.kind != NONE

    @property
    def label(self) -> str:
        """`none`, `fp8`, `int8+text-encoders`: what run.json, each results row and the checkpoints record."""
        return self.kind + ("+text-encoders" if self.text_encoders else "")

    def weight_bytes(self, unquantized: float) -> float:
        """Bytes per transformer weight value (`unquantized`: the run's dtype's)."""
        return WEIGHT_BYTES.get(self.kind, unquantized)

    def text_encoder_bytes(self, unquantized: float) -> float:
        """Bytes per text-encoder weight value."""
        return WEIGHT_BYTES[self.kind] if self.text_encoders else unquantized

    def flags(self) -> tuple[str, ...]:
        """The `gen run` arguments that ask for it (none: no argument)."""
        if not self.enabled:
            return ()
        return ("--quantization", self.kind, *(("--quantize-text-encoder",) if self.text_encoders else ()))


def parse_quantization(kind: str | None, text_encoders: bool = False) -> Quantization:
    """`--quantization` (None: none) and `--quantize-text-encoder` as a `Quantization`; ValueError naming the fix."""
    return Quantization(kind=kind or NONE, text_encoders=bool(text_encoders))
