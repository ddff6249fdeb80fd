"""What a model is, read cheaply: its family, the sizes it accepts, its defaults and its transformer's shape.

`ModelSpec` is plain data. It is resolved once per model name by `genbatch.models.resolve_model` (from a
preset name, a diffusers pipeline directory, or a Hugging Face hub id found in the local hub cache) by
reading small JSON configs only, never weights, and handed to what needs it: manifest validation,
scheduling, planning, the runner. Loading the weights is the runner's job. A spec's token count comes from
`genbatch.jobs.tokens`, the one derivation the cost estimate, the planner and the runner share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.jobs.tokens import latent_shape, token_count


class UnknownModelError(ValueError):
    """The model name is neither a preset nor a readable diffusers pipeline directory."""



@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The facts about one model that planning, validation and scheduling need, without its weights."""

    name: str
    """The name as the user gave it: a preset name, a pipeline directory or a hub id (`org/name[@rev]`)."""
    family: str
    """The model family's name (`genbatch.models`): which denoise hooks and parallel splits apply."""
    is_video: bool
    """True for text-to-video models (the output is an MP4, `num_frames` applies)."""
    uses_cfg: bool
    """True when the model runs a conditional and an unconditional branch per step (CFG parallel applies)."""
    cfg_needs_negative_prompt: bool = False
    """True when the second branch runs only for rows that give a `negative_prompt` (Qwen-Image's true CFG);
    such a row without one runs one branch."""
    size_multiple: int
    """Width and height must be multiples of this (VAE downsampling times the patch size)."""
    frame_multiple: int
    """Video only: `num_frames - 1` must be a multiple of this (the VAE's temporal compression)."""
    vae_spatial: int
    """Pixels per latent pixel along height and width."""
    patch_size: tuple[int, ...]
    """The transformer's patch size: (t, h, w) for video, (h, w) for images."""
    num_layers: int
    """Transformer blocks (all kinds together)."""
    num_heads: int
    """Attention heads; the Ulysses degree must divide it."""
    head_dim: int
    """Channels per head."""
    text_tokens: int
    """Text tokens the transformer attends to (jointly for MMDiT models, by cross-attention for Wan)."""
    joint_text: bool
    """True when the text tokens join the image tokens in self-attention (MMDiT); False for cross-attention."""
    ffn_dim: int
    """The transformer's MLP inner width."""
    out_channels: int
    """Latent channels the transformer predicts per token position, as the planner counts them."""
    parameters: int | None = None
    """Transformer parameter count when known (from the safetensors index or the preset)."""
    defaults: dict[str, float | int] = field(default_factory=dict)
    """Per-job defaults: width, height, num_frames, num_inference_steps, guidance_scale, fps."""
    path: str | None = None
    """The pipeline directory the weights load from (a hub id's cached snapshot); None for a preset."""
    media_inputs: tuple[str, ...] = ()
    """The media columns (`genbatch.jobs.media.MEDIA_COLUMNS`) this model takes: `("image",)` for Wan 2.1 I2V,
    `("image", "last_image")` for its first-and-last-frame model; empty for a text-only model, which refuses
    a row that names one."""
    media_required: tuple[str, ...] = ()
    """The media columns every row of this model must fill (image-to-video: `image`)."""
    joins_image_tokens: bool = False
    """True when an input image's latent tokens join the noise's in the transformer's image stream (FLUX.1
    Kontext, Qwen-Image-Edit), rather than its channels (Wan I2V). Sequence parallelism and DistriFusion split
    them with the rest; a PipeFusion patch holds a share of the rows of each grid (`FamilyHooks.conditioning_grids`)."""
    tp_all_reduces: float = 2.0
    """All-reduces of [N, d] a block does under tensor parallelism, over this model's blocks: the family's
    `TensorSplits.all_reduces_per_layer` of its block counts (seed 000's 2; Wan 3; FLUX and HunyuanVideo between
    1 and 2 by their dual- and single-stream blocks). What the planner charges a layer."""

    mlp_matrices: int = 2
    """The weight matrices of a layer's MLP, each `hidden_size x ffn_dim`: 2 (in and out) for a GELU MLP, 3 for a
    gated one (SwiGLU: gate, up and down; FLUX.2, Z-Image, Qwen-Image 2.1). What the planner charges its GEMMs."""

    keeps_prefix_kv: bool = False
    """True when the transformer keeps the keys and values of the tokens before the output's (the text and a
    condition image) from the first step and runs every later step on the output's tokens alone against them
    (Qwen-Image 2.1's block-causal transformer with `causal_condition`: the pipeline's `use_kv_cache`)."""

    audio_tokens_per_frame: float = 0.0
    """Audio tokens the transformer denoises beside the video's, per output frame (LTX-2: its audio latent's rate
    over the video's frame rate); 0 for a model without sound."""

    @property
    def makes_sound(self) -> bool:
        """True for a model whose videos carry sound (its transformer denoises audio tokens)."""
        return self.audio_tokens_per_frame > 0

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    def latent_shape(self, width: int, height: int, num_frames: int | None) -> tuple[int, ...]:
        """(frames, height, width) of the latent for video, (height, width) for images."""
        return latent_shape(width, height, num_frames, vae_spatial=self.vae_spatial,
                            vae_temporal=self.frame_multiple, is_video=self.is_video)

    def tokens(self, width: int, height: int, num_frames: int | None) -> int:
        """Image tokens the transformer sees for one sample (`token_count` of the latent)."""
        return token_count(self.latent_shape(width, height, num_frames), self.patch_size)

    def geometry_problems(self, width: int, height: int, num_frames: int | None) -> list[tuple[str, str]]:
        """The (column, reason) pairs for sizes this model cannot take; empty when they are fine."""
        problems = []
        for column, value in (("width", width), ("height", height)):
            if value % self.size_multiple:
                fixed = max(self.size_multiple, round(value / self.size_multiple) * self.size_multiple)
                problems.append((column, f"{value} is not a multiple of {self.size_multiple} (use {fixed})"))
        if self.is_video and num_frames is not None and (num_frames - 1) % self.frame_multiple:
            fixed = (num_frames - 1) // self.frame_multiple * self.frame_multiple + 1
            problems.append(
                ("num_frames", f"{num_frames} is not of the form {self.frame_multiple}k+1 (use {fixed})")
            )
        return problems
