"""LTX-2 image-to-video with sound (`diffusers.LTX2ImageToVideoPipeline`): what genbatch knows beyond text-to-video
(`genbatch.models.ltx2`).

The row's image is required. As `LTX2ImageToVideoPipeline.__call__` does with its defaults, it is first
re-compressed as one H.264 frame at the text encoder generation's CRF (33 for LTX-2's Gemma 3, `image_crf=None`
resolved by diffusers' `resolve_default_image_crf`; the compression the model was trained against), then resized
to the row's width x height by the pipeline's `video_processor` (stretched when the aspect ratio differs), and the
video VAE encodes it (its latent's mode, no noise drawn; in the pipeline's own `prepare_latents`, under the
runner's `parallel_encoding`) into the first latent frame. The noise fills the other frames; a first-frame mask
holds the image:
- the video tokens of the first latent frame run at timestep 0 (the transformer's per-token `timestep`; the
  audio and the prompt modulation at the step's), which sequence parallelism splits with the video;
- the scheduler steps every other frame (the first keeps the image's latent: its velocity is held at 0).
The re-compression runs through imageio-ffmpeg's ffmpeg (`genbatch.io.media.h264_still`: libx264, the
pipeline's CRF and `veryfast` preset, yuv420p) where diffusers uses PyAV, which genbatch does not depend on; the
two libx264 builds may differ in the re-compressed pixels. Everything after it is the pipeline's own, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import ltx2
from genbatch.models.ltx2_tiny import TINY_DEFAULTS, TINY_TRANSFORMER, TINY_VAE, tiny_components
from genbatch.models.base import TinyPreset
from genbatch.models.hooks import Trajectory
from genbatch.models.shapes import ImageEncode
from genbatch.models.spec import ModelSpec

CALL_DEFAULTS = dict(ltx2.CALL_DEFAULTS)
"""LTX2ImageToVideoPipeline.__call__'s defaults (LTX2Pipeline's)."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """LTX-2's spec, needing an image."""
    spec = ltx2.read_spec(name, transformer, vae, defaults or CALL_DEFAULTS, path)
    return replace(spec, family="ltx2-i2v", media_inputs=("image",), media_required=("image",))


def conditioning_image(pipe, job: JobSpec):
    """The row's image as the pipeline's `video_processor` receives it: an RGB PIL image, re-compressed as one H.264
    frame at the call's `image_crf` (None: the text encoder generation's default)."""
    import numpy as np
    from diffusers.pipelines.ltx2.utils import resolve_default_image_crf
    from PIL import Image

    from genbatch.io.media import h264_still

    if "image" not in job.media:
        raise ValueError(f"model {job.model} starts from an image and job {job.id} has none; fill the row's `image` "
                         "column with a path (relative to the manifest) or URL")
    image = job.media["image"].image.convert("RGB")
    crf = ltx2.call_defaults(pipe)["image_crf"]
    crf = resolve_default_image_crf(pipe.text_encoder) if crf is None else crf
    return Image.fromarray(h264_still(np.asarray(image), crf)) if crf else image


class LTX2I2VHooks(ltx2.LTX2Hooks):
    """LTX-2 from an image: its latent in the first frame, held there, at timestep 0."""

    name = "ltx2-i2v"
    per_row_shared = (*ltx2.LTX2Hooks.per_row_shared, "mask")

    def video_noise(self, pipe, job: JobSpec, generator, device, noise_scale: float):
        """The pipeline's own `prepare_latents`: the image's latent (1, Sv, Cv) in the first frame, noise after it,
        and the packed first-frame mask (1, Sv)."""
        import torch

        # (h, w) image -> (1, 3, H, W) in [-1, 1], in the prompt embeddings' dtype (the text encoder's)
        pixels = pipe.video_processor.preprocess(conditioning_image(pipe, job), height=job.height, width=job.width)
        pixels = pixels.to(device=device, dtype=pipe.text_encoder.dtype)
        latents, mask = pipe.prepare_latents(pixels, 1, pipe.transformer.config.in_channels, job.height, job.width,
                                             job.num_frames, noise_scale, torch.float32, device, generator, None)
        return latents, {"mask": mask}

    def timesteps(self, trajectory: Trajectory, timestep) -> dict:
        """The video's timestep per token, 0 on the image's (`t * (1 - mask)`); the audio's and the prompt
        modulation's the step's."""
        mask = trajectory.shared["mask"]
        if timestep.shape[0] != mask.shape[0]:  # the cfg branch's two halves: the mask twice, as the pipeline does
            mask = mask.repeat(timestep.shape[0] // mask.shape[0], 1)
        return {"timestep": timestep.unsqueeze(-1) * (1 - mask), "audio_timestep": timestep, "sigma": timestep}

    def hold(self, trajectory: Trajectory, video_velocity):
        """The image's tokens do not move: their velocity 0 (the pipeline steps the frames after the first only)."""
        keep = trajectory.shared["mask"].unsqueeze(-1) == 0  # (B, Sv) -> (B, Sv, 1)
        return video_velocity.where(keep, video_velocity.new_zeros(()))


def build_tiny(meta: frozenset[str] = frozenset()):
    """LTX-2 image-to-video: the tiny LTX-2 components (`genbatch.models.ltx2_tiny.tiny_components`)."""
    from diffusers import LTX2ImageToVideoPipeline

    return LTX2ImageToVideoPipeline(**tiny_components(meta))


FAMILY = replace(
    ltx2.FAMILY,
    name="ltx2-i2v",
    pipelines=("LTX2ImageToVideoPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=LTX2I2VHooks(),
    presets=(TinyPreset(name="tiny-ltx2-i2v", transformer=TINY_TRANSFORMER, vae=TINY_VAE, defaults=TINY_DEFAULTS,
                        build=build_tiny),),
    published=(),
    image_encode=ImageEncode(video=False, multiple=32),
)
