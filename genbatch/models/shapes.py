"""A model as the planner's cost model sees it (`ModelShape`: the family's `ModelSpec` plus what only the planner
needs), and the published models a family names (`Published`: their configs, from which its `read_spec` builds the
spec, as it does for a pipeline directory).

Plain data, no torch: `gen plan` reads shapes without loading a model. Token counts come from
`genbatch.jobs.tokens.token_count`, the same derivation the cost estimate and the runner use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from genbatch.jobs.tokens import latent_shape, token_count
from genbatch.models.spec import ModelSpec
from genbatch.models.vae_costs import IMAGE_VAE, VaeCosts


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Published:
    """A published model a family runs: its name and hub id, the configs its `read_spec` reads (as from the model's
    own `transformer/config.json` and `vae/config.json`), and the sizes the configs do not say."""

    name: str
    """The name `gen plan` and `gen run` take (`flux.1-dev`)."""
    hub_id: str | None
    """Its Hugging Face hub id (`black-forest-labs/FLUX.1-dev`): `gen run` resolves the name to it, `gen plan`
    prices the id as the name."""
    transformer: Mapping[str, Any]
    """Its transformer's config, as published."""
    vae: Mapping[str, Any]
    """Its VAE's config, as published."""
    defaults: Mapping[str, float | int] | None = None
    """Its per-job defaults (None: what the family's `read_spec` gives a pipeline directory)."""
    parameters: float
    """Transformer parameters."""
    text_encoder_parameters: float
    """Parameters of all its text encoders together."""
    text_encoder_split_parameters: float = 0.0
    """Of those, the ones `--text-encoder-parallel auto` splits over a job group (0: none)."""
    vae_parameters: float
    """VAE parameters."""
    spec_facts: Mapping[str, Any] = field(default_factory=dict)
    """What its configs do not say and its model card does, as `ModelSpec` fields (a step-distilled model's one
    branch: `{"uses_cfg": False}`); empty for most."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape(ModelSpec):
    """One model as the cost model sees it: its family's `ModelSpec` (everything read from its configs), and the
    sizes and costs only the planner needs. `ModelShape.of` builds it from a spec; nothing is copied by hand."""

    text_encoder_parameters: float = 0.0
    """Parameters of all text encoders together (kept on every rank unless split)."""
    text_encoder_split_parameters: float = 0.0
    """Of those, the ones `--text-encoder-parallel auto` splits tensor-parallel over a job group (the layers of an
    encoder at least 4096 wide: `genbatch.parallel.tensor.encoders`); 0: none, or not known (a directory's shape)."""
    vae_parameters: float = 0.0
    """VAE parameters."""
    vae_costs: VaeCosts = IMAGE_VAE
    """Its VAE's decode and encode costs (`ModelFamily.vae_costs`)."""
    hub_id: str | None = None
    """A published model's hub id."""
    sequence_parallel: bool = True
    """False when genbatch has no sequence-parallel splits for the model's transformer: ulysses, ring and
    DistriFusion do not apply to it."""
    patch_parallel: bool = True
    """False when the model's sequence split keeps a prefix the output attends to causally (Qwen-Image 2.1's
    `KeptPrefix`): DistriFusion's stale patches do not apply to it, ulysses and ring do."""
    pipeline_stages: bool = True
    """False when the model's transformer takes no PipeFusion stages: pp does not apply to it."""
    pads_frames_to_patch: bool = False
    """True when the pipeline pads the latent frames up to a multiple of the temporal patch before patching
    (CogVideoX 1.5 does); False when the patch embedding sees the latent as it is."""

    @classmethod
    def of(cls, spec: ModelSpec, **planner: Any) -> ModelShape:
        """`spec` with the planner's fields `planner` (which may also set a spec field the planner knows better:
        `parameters`, counted)."""
        values = {spec_field.name: getattr(spec, spec_field.name) for spec_field in fields(ModelSpec)}
        values.update(planner)
        return cls(**values)

    @property
    def vae_class(self) -> str:
        """The diffusers class of the VAE its costs were counted on."""
        return self.vae_costs.vae_class

    @property
    def vae_temporal(self) -> int:
        """Frames per latent frame (video); 1 for images."""
        return self.frame_multiple if self.is_video else 1

    @property
    def width(self) -> int:
        """Default width."""
        return int(self.defaults.get("width") or 1024)

    @property
    def height(self) -> int:
        """Default height."""
        return int(self.defaults.get("height") or 1024)

    @property
    def frames(self) -> int | None:
        """Default frames (video), None for images."""
        frames = self.defaults.get("num_frames")
        return int(frames) if self.is_video and frames else None

    @property
    def steps(self) -> int:
        """Default denoising steps."""
        return int(self.defaults.get("num_inference_steps") or 28)

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
        text tokens for MMDiT models, plus a video's audio tokens (LTX-2: `ModelSpec.audio_tokens_per_frame`)."""
        image = self.image_tokens(width, height, frames) * (2 if self.joins_image_tokens else 1)
        audio = round(max(frames or 1, 1) * self.audio_tokens_per_frame) if self.audio_tokens_per_frame else 0
        return image + (self.text_tokens if self.joint_text else 0) + audio
