"""A model as the planner's cost model sees it (`ModelShape`), and the VAE cost constants published shapes use.

Plain data, no torch: `gen plan` reads shapes without loading a model. Each family module lists its
published models' shapes (`ModelFamily.published`); `genbatch.planner.shapes` turns a preset's or a pipeline
directory's `ModelSpec` into a shape. Token counts come from `genbatch.jobs.tokens.token_count`, the same
derivation the cost estimate and the runner use.
"""

from __future__ import annotations

from dataclasses import dataclass

from genbatch.jobs.tokens import latent_shape, token_count

@dataclass(frozen=True, kw_only=True, slots=True)
class ImageEncode:
    """How a family's rows feed an image to the VAE encoder before they denoise (`ModelFamily.image_encode`;
    the planner prices that encode, `genbatch.planner.conditioning`)."""

    video: bool
    """True: the conditioning video (first frame, zeros, last frame) at the output's size and frames; False: one
    image."""
    area: int | None = None
    """Pixels the input image is resized to (at its aspect ratio); None: the output's size."""
    multiple: int = 16
    """Each side of the resized input is rounded to a multiple of this."""
    required: bool = True
    """True when every row of the model carries an image."""


IMAGE_VAE_MFLOP_PER_PIXEL = 9.9
"""FLUX/SD3 AutoencoderKL decoder (channels 512,512,256,128; 3 resnets a stage): counting its 3x3 convs gives
10.4 TFLOP for a 1024x1024 image, 9.9 MFLOP per output pixel."""
WAN_VAE_MFLOP_PER_PIXEL = 8.5
"""Wan 2.1 VAE decoder (channels 384,384,192,96; 3x3x3 causal convs, 3 resnets a stage): 8.5 MFLOP per output
pixel and frame, counted the same way."""
HEAVY_VIDEO_VAE_MFLOP_PER_PIXEL = 25.0
"""HunyuanVideo and CogVideoX 3D VAE decoders (channels 512,512,256,128 with 3x3x3 convs): about 25 MFLOP per
output pixel and frame, counted the same way."""
IMAGE_VAE_GIB_PER_MPX = 2.0 / 1.048576
"""VAE decode peak memory for images: seed 000 §7.1, 2 GiB at 1024x1024 and 8 GiB at 2048x2048."""
VIDEO_VAE_GIB_PER_MPX = 107.0 / (1280 * 720 * 81 / 1e6)
"""VAE decode peak for video, per million pixel-frames: seed 000 §7.1, 107 GiB for Wan 720p 81 frames
(used for the other video VAEs too, which publish no figure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """One model as the cost model sees it."""

    name: str
    """The name it was asked for by."""
    is_video: bool
    """True when outputs are videos (frames count)."""
    uses_cfg: bool
    """True when each step runs a conditional and an unconditional forward (CFG parallel applies)."""
    num_layers: int
    """Transformer blocks, all kinds together."""
    num_heads: int
    """Attention heads (Ulysses and TP degrees must divide it)."""
    head_dim: int
    """Channels per head; hidden size = heads x head dim."""
    ffn_dim: int
    """MLP inner width."""
    parameters: float
    """Transformer parameters."""
    text_encoder_parameters: float
    """Parameters of all text encoders together (kept on every rank)."""
    text_encoder_split_parameters: float = 0.0
    """Of those, the ones `--text-encoder-parallel auto` splits tensor-parallel over a job group (the layers of an
    encoder at least 4096 wide: `genbatch.parallel.tensor.encoders`); 0: none, or not known (a directory's shape)."""
    vae_parameters: float
    """VAE parameters."""
    joint_text: bool
    """True when text tokens join the image tokens in self-attention (MMDiT); False for cross-attention (Wan)."""
    text_tokens: int
    """Text tokens per prompt."""
    patch_size: tuple[int, ...]
    """Transformer patch over the latent: (t, h, w) for video, (h, w) for images."""
    vae_spatial: int
    """Pixels per latent pixel, along height and width."""
    vae_temporal: int
    """Frames per latent frame (video); 1 for images."""
    out_channels: int
    """Latent channels the transformer predicts per latent pixel (the CFG exchange carries these)."""
    vae_mflop_per_pixel: float
    """VAE decode work per output pixel (and frame), MFLOP."""
    vae_gib_per_mpx: float
    """VAE decode peak memory per million output pixels (and frames), GiB."""
    width: int
    """Default width."""
    height: int
    """Default height."""
    frames: int | None
    """Default frames (video), None for images."""
    steps: int
    """Default denoising steps."""
    vae_class: str = ""
    """The diffusers class of the VAE (`AutoencoderKLWan`): the planner models that class's decode peak in each
    decode mode (`genbatch.planner.vae_memory`); empty: the planner assumes the image VAE for images and Wan's
    frame-causal one for video."""
    tp_all_reduces: float = 2.0
    """All-reduces of [N, d] a layer does under tensor parallelism, over the model's block types
    (`TensorPlan.all_reduces_per_layer`): seed 000's standard 2, Wan's 3, FLUX's 4/3 (19 dual-stream blocks
    at 2, 38 single-stream ones at 1)."""
    joins_image_tokens: bool = False
    """True for an edit model (FLUX.1 Kontext, Qwen-Image-Edit): the input image's latent tokens follow the
    output's in the image stream, so self-attention runs over both; priced with the input at the output's size
    (each pipeline resizes it to about that many pixels, at its own aspect ratio)."""
    sequence_parallel: bool = True
    """False when genbatch has no sequence-parallel plan for the model's transformer (Qwen-Image 2.1's block-causal
    attention): ulysses, ring and DistriFusion do not apply to it."""
    pipeline_stages: bool = True
    """False when the model's transformer takes no PipeFusion stages (no `TransformerPlan.carried`, or no sequence
    plan for its patches): pp does not apply to it."""
    pads_frames_to_patch: bool = False
    """True when the pipeline pads the latent frames up to a multiple of the temporal patch before patching
    (CogVideoX 1.5 does); False when the patch embedding sees the latent as it is."""

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    def image_tokens(self, width: int, height: int, frames: int | None) -> int:
        """Tokens of the latent after patching (`genbatch.jobs.tokens.token_count`)."""
        latent = latent_shape(width, height, max(frames or 1, 1), vae_spatial=self.vae_spatial,
                              vae_temporal=self.vae_temporal, is_video=self.is_video)
        if self.is_video and self.pads_frames_to_patch:
            patch_t = self.patch_size[0]
            latent = (-(-latent[0] // patch_t) * patch_t, *latent[1:])
        return token_count(latent, self.patch_size)

    def sequence(self, width: int, height: int, frames: int | None) -> int:
        """Tokens in self-attention: image tokens (twice for an edit model: the input's join the output's), plus
        text tokens for MMDiT models."""
        image = self.image_tokens(width, height, frames) * (2 if self.joins_image_tokens else 1)
        return image + (self.text_tokens if self.joint_text else 0)
