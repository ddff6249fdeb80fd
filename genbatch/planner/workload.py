"""One job as the planner prices it: a model shape at a size and a step count."""

from __future__ import annotations

from dataclasses import dataclass

from genbatch.planner.shapes import ModelShape

BYTES_PER_VALUE = 2
"""bf16 weights, activations and messages."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """The size of one job."""

    shape: ModelShape
    """The model."""
    width: int
    """Output width, pixels."""
    height: int
    """Output height, pixels."""
    frames: int | None
    """Output frames (video), None for images."""
    steps: int
    """Denoising steps."""
    offload_text_encoder: bool = False
    """True when the text encoders leave the GPU after encoding (loaded again for each job); False when they
    stay resident beside the transformer."""

    @property
    def image_tokens(self) -> int:
        return self.shape.image_tokens(self.width, self.height, self.frames)

    @property
    def sequence(self) -> int:
        """Tokens in self-attention (N in seed 000's formulas)."""
        return self.shape.sequence(self.width, self.height, self.frames)

    @property
    def megapixels(self) -> float:
        """Output pixels (times frames for video), millions."""
        return self.width * self.height * (self.frames or 1) / 1e6

    @property
    def prediction_bytes(self) -> float:
        """One noise prediction, [image tokens, out channels x patch volume] (seed 000 §5.1: N c p^2)."""
        volume = 1
        for patch in self.shape.patch_size:
            volume *= patch
        return self.image_tokens * self.shape.out_channels * volume * BYTES_PER_VALUE

    def describe(self) -> str:
        size = f"{self.width}x{self.height}" + (f"x{self.frames}f" if self.frames else "")
        branches = "2 branches (CFG)" if self.shape.uses_cfg else "1 branch"
        return f"{self.shape.name} {size} {self.steps} steps x {branches} ({self.sequence} tokens)"


def make_workload(
    shape: ModelShape,
    *,
    width: int | None = None,
    height: int | None = None,
    frames: int | None = None,
    steps: int | None = None,
    offload_text_encoder: bool = False,
) -> Workload:
    """The workload at the given size, the model's defaults filling what is not given."""
    width = shape.width if width is None else width
    height = shape.height if height is None else height
    steps = shape.steps if steps is None else steps
    for flag, value in (("--width", width), ("--height", height), ("--steps", steps)):
        if value < 1:
            raise ValueError(f"{flag} {value} must be at least 1")
    if shape.is_video:
        frames = shape.frames if frames is None else frames
        if frames is None or frames < 1:
            raise ValueError(f"--frames {frames} must be at least 1 for the video model {shape.name}")
    elif frames not in (None, 1):
        raise ValueError(f"--frames {frames} applies to video models; {shape.name} makes images (drop --frames)")
    else:
        frames = None
    return Workload(shape=shape, width=width, height=height, frames=frames, steps=steps,
                    offload_text_encoder=offload_text_encoder)
