"""HunyuanVideo 1.5 image-to-video (`diffusers.HunyuanVideo15ImageToVideoPipeline`): everything genbatch knows about
the family beyond the text-to-video one's (`genbatch.models.hunyuan_video15`).

The hooks reproduce `HunyuanVideo15ImageToVideoPipeline.__call__` exactly. The row's image is required (a row
without one is rejected at validation, naming the `image` column), and it decides the video's size:
- **The output size follows the image.** The pipeline takes no height or width: it picks the size bucket of the
  image's aspect ratio at the transformer's `target_size` (about 640^2 pixels for the 480p models, 960^2 for the
  720p ones, multiples of the VAE's 16), and resizes the image to fill it, cropping the centre (its
  `calculate_default_height_width`, then `resize_mode="crop"`). A row's `width` and `height` are not used (the
  spec's defaults, the 16:9 bucket, are what the planner prices).
- **The image tokens.** A SigLIP vision tower's last hidden states of that image (its processor resizes it
  again, to the tower's 384^2) are the 729 image tokens every forward attends to, valid (text-to-video's are
  masked zeros). Both guidance branches see them.
- **The latents.** The VAE encodes the image as one frame (the latent's mode, times its scaling factor; in the
  pipeline's own `prepare_cond_latents_and_mask`, so under the runner's `parallel_encoding`: patch-parallel over
  the job group, exactly) and it rides as the first latent frame of the conditioning channels, zeros after it,
  with a first-frame mask: [noise, image latents, mask] every step.
- **MeanFlow.** A transformer with `use_meanflow` (the step-distilled checkpoints) also takes the next step's
  timestep (0 at the last step), as the pipeline passes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import hunyuan_video15
from genbatch.models import hunyuan_video15_tiny as tiny
from genbatch.models.base import TinyPreset
from genbatch.models.shapes import ImageEncode
from genbatch.models.spec import ModelSpec

SIGLIP_PARAMETERS = 0.43e9
"""The SigLIP vision tower (so400m, patch 14, 384^2: 27 x 27 = 729 image tokens), counted on its config."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """The text-to-video spec, needing an image."""
    spec = hunyuan_video15.read_spec(name, transformer, vae, defaults, path)
    return replace(spec, family="hunyuan-video-15-i2v", media_inputs=("image",), media_required=("image",))


class HunyuanVideo15I2VHooks(hunyuan_video15.HunyuanVideo15Hooks):
    """HunyuanVideo 1.5 started from an image: its SigLIP tokens in the text, its latents in the first frame."""

    name = "hunyuan-video-15-i2v"

    @staticmethod
    def resized(pipe, job: JobSpec):
        """(the row's image resized and cropped to its size bucket, height, width), as the pipeline does it."""
        if "image" not in job.media:
            raise ValueError(f"model {job.model} starts from an image and job {job.id} has none; fill the row's "
                             "`image` column with a path (relative to the manifest) or URL")
        image = job.media["image"].image
        height, width = pipe.video_processor.calculate_default_height_width(
            height=image.size[1], width=image.size[0], target_size=pipe.target_size)
        return pipe.video_processor.resize(image, height=height, width=width, resize_mode="crop"), height, width

    def image_embeds(self, pipe, job: JobSpec, device):
        # SigLIP's last hidden states of the resized image: (1, 729, d) for the published tower
        image, _, _ = self.resized(pipe, job)
        return pipe.encode_image(image=image, batch_size=1, device=device, dtype=pipe.transformer.dtype)

    def size(self, pipe, job: JobSpec) -> tuple[int, int]:
        _, height, width = self.resized(pipe, job)
        return height, width

    def conditioning(self, pipe, job: JobSpec, latents, height: int, width: int, device):
        # the image's latents (its VAE encode's mode) as the first latent frame, zeros after; the mask 1 there
        image, _, _ = self.resized(pipe, job)
        return pipe.prepare_cond_latents_and_mask(latents=latents, image=image, batch_size=1, height=height,
                                                  width=width, dtype=pipe.transformer.dtype, device=device)

    def timestep_r(self, pipe, trajectory, latents, step: int):
        import torch

        if not pipe.transformer.config.use_meanflow:
            return None
        timesteps = trajectory.timesteps
        following = torch.tensor([0.0], device=latents.device) if step == len(timesteps) - 1 else timesteps[step + 1]
        return following.expand(latents.shape[0]).to(latents.dtype)


FAMILY = replace(
    hunyuan_video15.FAMILY,
    name="hunyuan-video-15-i2v",
    pipelines=("HunyuanVideo15ImageToVideoPipeline",),
    read_spec=read_spec,
    hooks=HunyuanVideo15I2VHooks(),
    image_encode=ImageEncode(video=False),  # the image alone, one frame at the output's size
    presets=(TinyPreset(name="tiny-hunyuan-video-15-i2v", transformer=tiny.TINY_I2V_TRANSFORMER, vae=tiny.TINY_VAE,
                        defaults=tiny.TINY_DEFAULTS, build=tiny.build_tiny_i2v),),
    published=tuple(hunyuan_video15.published(
        name, config, text_encoder_parameters=hunyuan_video15.TEXT_ENCODER_PARAMETERS + SIGLIP_PARAMETERS)
        for name, config in (("hunyuanvideo-1.5-i2v-480p", "480p_i2v"), ("hunyuanvideo-1.5-i2v-720p", "720p_i2v"))),
)
