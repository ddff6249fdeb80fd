"""One job as the planner prices it: a model shape at a size and a step count, the pixels its VAE encodes
first when it starts from an image, and the rows batched into each forward."""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.jobs.quantization import Quantization
from genbatch.planner.shapes import ModelShape

BYTES_PER_VALUE = 2
"""bf16 weights, activations and messages."""
VIDEO_VAE_BYTES_PER_VALUE = 4
"""A video model's VAE encodes and decodes in fp32 (`genbatch.runner.loading.finish_placement`, as the Wan
reference code runs it); an image model's in the run's bf16."""
MAX_BATCH = 256
"""The largest `--batch-size` the planner prices (the runner's `auto` stops at 16)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodeInput:
    """What the VAE encoder sees before a conditioned job denoises (`genbatch.planner.conditioning`)."""

    width: int
    """Input width, pixels."""
    height: int
    """Input height, pixels."""
    frames: int | None
    """Input frames (Wan I2V's conditioning video: the output's frames); None for one image."""
    what: str
    """What it is, for the plan's text: `conditioning video`, `input image`, `first frame`."""

    def describe(self) -> str:
        size = f"{self.width}x{self.height}" + (f"x{self.frames}f" if self.frames else "")
        return f"{self.what} {size}"


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
    encode: EncodeInput | None = None
    """The VAE encode before denoising of an image-conditioned job; None: the job starts from noise alone."""
    batch: int = 1
    """Rows denoised together in one forward (`--batch-size`): GEMM rows and activations grow by it; the
    weights, and the VAE encode and decode (which run row by row), do not."""
    quantization: Quantization = field(default_factory=Quantization)
    """`--quantization` and `--quantize-text-encoder`: the width the transformer's (and the text encoders')
    weights are held and all-gathered at, and, for fp8 on a GPU with FP8 GEMMs, the rate its linear layers run
    at (`genbatch.planner.cost`)."""

    @property
    def weight_bytes_per_value(self) -> float:
        """Bytes of one transformer weight: bf16's 2, or 1 quantized (fp8, int8). The rule is the shape's
        parameter count times this, for any model: a DiT's parameters are nearly all in its Linear layers (its
        norms and embeddings, left unquantized, are under 1%)."""
        return self.quantization.weight_bytes(BYTES_PER_VALUE)

    @property
    def text_encoder_bytes_per_value(self) -> float:
        """Bytes of one text-encoder weight: 1 with `--quantize-text-encoder`, else bf16's 2."""
        return self.quantization.text_encoder_bytes(BYTES_PER_VALUE)

    @property
    def vae_bytes_per_value(self) -> int:
        """Bytes of one value the runner's VAE runs in, for its encode and its decode alike: fp32 (4) for a video
        model, bf16 (2) for an image model. The runner decides it in `genbatch.runner.loading.finish_placement`,
        which casts a video model's VAE to fp32 after placing the pipeline in the run's dtype; the latents are
        cast to the VAE's dtype before decoding (`genbatch.models.wan`), so its activations and output are too."""
        return VIDEO_VAE_BYTES_PER_VALUE if self.shape.is_video else BYTES_PER_VALUE

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
        batch = f", batches of {self.batch}" if self.batch > 1 else ""
        encode = f", VAE-encoding its {self.encode.describe()}" if self.encode is not None else ""
        quantized = self.quantization
        weights = (f", {quantized.kind} weights" + (" (text encoders too)" if quantized.text_encoders else "")
                   if quantized.enabled else "")
        return (f"{self.shape.name} {size} {self.steps} steps x {branches} ({self.sequence} tokens){batch}{encode}"
                f"{weights}")


def make_workload(
    shape: ModelShape,
    *,
    width: int | None = None,
    height: int | None = None,
    frames: int | None = None,
    steps: int | None = None,
    offload_text_encoder: bool = False,
    encode: EncodeInput | None = None,
    batch: int = 1,
    quantization: Quantization | None = None,
) -> Workload:
    """The workload at the given size, the model's defaults filling what is not given; `encode`: what its VAE
    encodes first (`conditioning.encode_input`), `batch`: rows per forward, `quantization`: the weights' width
    (None: the run's dtype)."""
    width = shape.width if width is None else width
    height = shape.height if height is None else height
    steps = shape.steps if steps is None else steps
    for flag, value in (("--width", width), ("--height", height), ("--steps", steps), ("--batch-size", batch)):
        if value < 1:
            raise ValueError(f"{flag} {value} must be at least 1")
    if batch > MAX_BATCH:
        raise ValueError(f"--batch-size {batch} is more than the planner prices ({MAX_BATCH}); give at most that")
    if shape.is_video:
        frames = shape.frames if frames is None else frames
        if frames is None or frames < 1:
            raise ValueError(f"--frames {frames} must be at least 1 for the video model {shape.name}")
    elif frames not in (None, 1):
        raise ValueError(f"--frames {frames} applies to video models; {shape.name} makes images (drop --frames)")
    else:
        frames = None
    return Workload(shape=shape, width=width, height=height, frames=frames, steps=steps,
                    offload_text_encoder=offload_text_encoder, encode=encode, batch=batch,
                    quantization=quantization or Quantization())
