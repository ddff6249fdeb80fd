"""FLUX.1 Kontext image editing (`diffusers.FluxKontextPipeline`): everything genbatch knows about the family
beyond FLUX's own (`genbatch.models.flux`).

The hooks reproduce `FluxKontextPipeline.__call__` exactly. The row's image is the edit's input:
- **Its size.** By default it is resized, as the pipeline's default `_auto_resize` does it, to the one of
  Kontext's preferred resolutions (about 1 megapixel, `PREFERRED_KONTEXT_RESOLUTIONS`) whose aspect ratio is
  nearest its own, rounded down to a multiple of 16. A model whose defaults carry `auto_resize: 0` (the tiny
  preset, whose sizes are tens of pixels) keeps the image's own size, rounded down to a multiple of 16.
- **Its tokens.** The VAE encodes it (the latent's mode, no noise drawn) and its packed latent tokens follow the
  noise's in the transformer's one image stream, with position ids whose first axis is 1; the prediction keeps
  the noise's tokens only. So sequence parallelism and DistriFusion split both, as one stream; a PipeFusion
  patch holds a share of the rows of each grid, the noise's and the input's (`conditioning_grids`).
- **The output size** is the row's width x height: the pipeline is given those and `max_area = width x height`,
  which keeps them.

A row without an image runs as FLUX.1 text-to-image, as the pipeline does with `image=None`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import flux, tiny_configs
from genbatch.models.base import TinyPreset
from genbatch.models.shapes import ImageEncode
from genbatch.models.hooks import TokenGrid, Trajectory
from genbatch.models.spec import ModelSpec

CALL_DEFAULTS = {**flux.CALL_DEFAULTS, "guidance_scale": 3.5, "auto_resize": 1}
"""FluxKontextPipeline.__call__'s defaults; `auto_resize` is its `_auto_resize` (1: the preferred resolutions)."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """FLUX's spec, taking an optional image."""
    if defaults is None:
        spatial = 2 ** (len(vae["block_out_channels"]) - 1)
        defaults = {**CALL_DEFAULTS, "width": flux.SAMPLE_SIZE * spatial, "height": flux.SAMPLE_SIZE * spatial}
    return replace(flux.read_spec(name, transformer, vae, defaults, path), family="flux-kontext",
                   media_inputs=("image",), joins_image_tokens=True)


def input_size(image_size: tuple[int, int], multiple: int, auto_resize: bool) -> tuple[int, int]:
    """(width, height) the pipeline resizes an input image of `image_size` (width, height) to: the preferred
    resolution nearest its aspect ratio (`auto_resize`) or its own size, each rounded down to `multiple`."""
    from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

    width, height = image_size
    if auto_resize:
        _, width, height = min((abs(width / height - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    return width // multiple * multiple, height // multiple * multiple


def _auto_resize(job: JobSpec) -> bool:
    from genbatch.models.resolve import resolve_model

    return bool(resolve_model(job.model).defaults.get("auto_resize", CALL_DEFAULTS["auto_resize"]))


class FluxKontextHooks(flux.FluxHooks):
    """FLUX.1 Kontext: FLUX's one branch per step, the input image's latent tokens after the noise's."""

    name = "flux-kontext"
    per_row_shared = ("guidance", "image_latents")

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import torch

        pixels = None
        if "image" in job.media:
            image = job.media["image"].image
            width, height = input_size(image.size, pipe.vae_scale_factor * 2, _auto_resize(job))
            pixels = pipe.image_processor.preprocess(pipe.image_processor.resize(image, height, width), height, width)
        channels, dtype = self.noise_format(pipe)
        # the image's latent tokens (its mode: no noise drawn), then the noise's, drawn as FluxPipeline draws it
        latents, image_latents, latent_ids, image_ids = pipe.prepare_latents(
            pixels, 1, channels, job.height, job.width, dtype, device, generator)
        trajectory = self.schedule(pipe, job, latents, device)
        joined = latent_ids if image_ids is None else torch.cat([latent_ids, image_ids], dim=0)
        trajectory.shared.update(img_ids=joined, image_latents=image_latents)
        return trajectory

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        image_latents = trajectory.shared.get("image_latents")
        if image_latents is None:
            return super().predict(pipe, trajectory, latents, t, step, branch)
        # (b, n, c) + (b, m, c) -> (b, n + m, c): one image stream; the prediction keeps the noise's n tokens
        joined = torch.cat([latents, image_latents], dim=1)
        return super().predict(pipe, trajectory, joined, t, step, branch)[:, :latents.shape[1]]

    def conditioning_grids(self, pipe, trajectory: Trajectory) -> tuple[TokenGrid, ...]:
        """The input image's grid after the noise's (none for a row without an image): its position ids are
        (1, row, column) per token, so a row holds the largest column plus one."""
        image_latents = trajectory.shared.get("image_latents")
        if image_latents is None:
            return ()
        tokens = image_latents.shape[1]  # (b, m, c): the same m for every row of a batch
        image_ids = trajectory.shared["img_ids"][-tokens:]  # (m, 3), after the noise's
        return (TokenGrid(tokens=tokens, row_tokens=int(image_ids[:, 2].max()) + 1),)


def build_tiny(meta: frozenset[str] = frozenset()):
    """FLUX.1 Kontext: FLUX's tiny components (`flux.tiny_components`) in FluxKontextPipeline."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**flux.tiny_components(meta))


FAMILY = replace(
    flux.FAMILY,
    name="flux-kontext",
    pipelines=("FluxKontextPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=FluxKontextHooks(),
    # the input at Kontext's preferred resolution nearest its aspect ratio: about a megapixel; a row may have none
    image_encode=ImageEncode(video=False, area=1024 * 1024, multiple=16, required=False),
    presets=(TinyPreset(name="tiny-flux-kontext", transformer=tiny_configs.TINY_FLUX_TRANSFORMER,
                        vae=tiny_configs.TINY_FLUX_VAE, defaults=tiny_configs.PRESET_DEFAULTS["tiny-flux-kontext"],
                        build=build_tiny),),
    # FLUX.1-Kontext-dev is FLUX.1-dev's transformer, VAE and text encoders; its sequence carries the input's tokens
    vae_costs=flux.FAMILY.vae_costs,
    # FLUX.1 Kontext [dev]: FLUX.1 [dev]'s architecture (its read_spec adds the input image's tokens)
    published=(replace(flux.FAMILY.published[0], name="flux.1-kontext-dev",
                       hub_id="black-forest-labs/FLUX.1-Kontext-dev"),),
    teacache=(),
)
