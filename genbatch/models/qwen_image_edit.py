"""Qwen-Image-Edit image editing (`diffusers.QwenImageEditPipeline`): everything genbatch knows about the family
beyond Qwen-Image's own (`genbatch.models.qwen_image`).

The hooks reproduce `QwenImageEditPipeline.__call__` exactly. The row's image is the edit's input, and the
pipeline needs one: a row without an image is rejected at validation, naming the `image` column.
- **Its size.** It is resized, as the pipeline's `calculate_dimensions` does it, to about one megapixel
  (`INPUT_AREA`, 1024 x 1024) at its own aspect ratio, each side rounded to the nearest multiple of 32, whatever
  its own size and the output's (a plain resize: its aspect ratio is kept up to that rounding, nothing is
  cropped). That one resized image is both what the prompt encode sees and what the VAE encodes. The model's
  defaults may carry another area, `input_area`: the tiny preset's is 64 x 64 (its sizes are tens of pixels,
  and a megapixel input would be 4096 of its tokens); the pipeline has the megapixel as a constant.
- **The prompt encode.** Qwen2.5-VL reads the prompt in the edit template with the image: the processor turns
  the resized image into the vision tower's patches (resizing it again, by its own `min_pixels`/`max_pixels`
  rule, to multiples of its patch size times its merge size) and the template's one `<|image_pad|>` into one
  token per merged patch; the vision tower's outputs take those tokens' place. Both guidance branches (the
  prompt and the negative prompt) see the image.
- **Its tokens.** The VAE encodes it (the latent's mode, no noise drawn; normalised by the VAE's per-channel
  mean and std) and its packed latent tokens follow the noise's in the transformer's one image stream;
  `img_shapes` carries both grids, so the rotary positions of each are their own. The prediction keeps the
  noise's tokens only. So sequence parallelism and DistriFusion split both, as one stream (the transformer's
  own `_cp_plan`), and a PipeFusion patch holds a share of the rows of each grid, the noise's and the input's
  (Qwen-Image's `conditioning_grids`, read from `img_shapes`).
- **The output size** is the row's width x height: the pipeline is given those as `height` and `width`, which
  it keeps (the sizes are multiples of 16, the spec's `size_multiple`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import qwen_image
from genbatch.models.base import TinyPreset
from genbatch.models.shapes import ImageEncode
from genbatch.models.hooks import COND, UNCOND, Conditioning, Trajectory
from genbatch.models.spec import ModelSpec

INPUT_AREA = 1024 * 1024
"""The area (pixels) `QwenImageEditPipeline.__call__` resizes the input image to, at its aspect ratio."""
INPUT_MULTIPLE = 32
"""`calculate_dimensions` rounds each side of the resized input to a multiple of this."""

CALL_DEFAULTS = {**qwen_image.CALL_DEFAULTS, "input_area": INPUT_AREA}
"""QwenImageEditPipeline.__call__'s defaults (as Qwen-Image's); `input_area` is the area its input is resized to."""
TINY_DEFAULTS = {**qwen_image.TINY_DEFAULTS, "input_area": 64 * 64}
"""Qwen-Image's tiny defaults; the input resized to about 64 x 64 pixels (16 tokens), not a megapixel."""
TINY_PROCESSOR = dict(min_pixels=56 * 56, max_pixels=56 * 84, patch_size=14, temporal_patch_size=2, merge_size=2)
"""The tiny preset's Qwen2-VL image processor: the vision tower sees the input at a few thousand pixels (a
handful of image tokens after the 2 x 2 merge), where the real one's `max_pixels` is 12.8 million."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """Qwen-Image's spec, needing an image."""
    if defaults is None:
        spatial = 2 ** len(vae["temperal_downsample"])
        defaults = {**CALL_DEFAULTS, "width": qwen_image.SAMPLE_SIZE * spatial,
                    "height": qwen_image.SAMPLE_SIZE * spatial}
    return replace(qwen_image.read_spec(name, transformer, vae, defaults, path), family="qwen-image-edit",
                   media_inputs=("image",), media_required=("image",), joins_image_tokens=True)


def input_size(image_size: tuple[int, int], area: int = INPUT_AREA) -> tuple[int, int]:
    """(width, height) the pipeline resizes an input image of `image_size` (width, height) to: `area` at the
    image's aspect ratio, each side rounded to the nearest multiple of 32 (its `calculate_dimensions`)."""
    import math

    width, height = image_size
    ratio = width / height
    target_width = math.sqrt(area * ratio)
    target_height = target_width / ratio
    size = tuple(round(side / INPUT_MULTIPLE) * INPUT_MULTIPLE for side in (target_width, target_height))
    if not all(size):
        raise ValueError(f"an input image of {width}x{height} resized to {area} pixels at its aspect ratio has a side "
                         f"under {INPUT_MULTIPLE // 2} pixels; crop it to a less extreme aspect ratio")
    return size


def _input_area(job: JobSpec) -> int:
    from genbatch.models.resolve import resolve_model

    return int(resolve_model(job.model).defaults.get("input_area", INPUT_AREA))


class QwenImageEditHooks(qwen_image.QwenImageHooks):
    """Qwen-Image-Edit: Qwen-Image's true CFG, the prompt encoded with the input image, and the input's latent
    tokens after the noise's in the image stream."""

    name = "qwen-image-edit"
    per_row_shared = ("img_shapes", "image_latents")

    @staticmethod
    def _resized(pipe, job: JobSpec):
        """The row's image resized as the pipeline resizes it, and its (width, height)."""
        if "image" not in job.media:
            raise ValueError(f"model {job.model} edits an image and job {job.id} has none; fill the row's `image` "
                             "column with a path (relative to the manifest) or URL")
        image = job.media["image"].image
        width, height = input_size(image.size, _input_area(job))
        return pipe.image_processor.resize(image, height, width), (width, height)

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        image, _ = self._resized(pipe, job)
        use_cfg = job.guidance_scale > 1.0 and job.negative_prompt is not None
        texts = {COND: job.prompt, **({UNCOND: job.negative_prompt} if use_cfg else {})}
        branches = {}
        for branch, text in texts.items():
            # the prompt in the edit template, the image's vision tokens in it (both branches see the image)
            embeds, mask = pipe.encode_prompt(prompt=text, image=image, device=device, num_images_per_prompt=1,
                                              max_sequence_length=qwen_image.MAX_SEQUENCE_LENGTH)
            branches[branch] = {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        self.check_guidance(pipe, job)
        image, (width, height) = self._resized(pipe, job)
        # (h, w) image -> (1, 3, 1, h, w) in [-1, 1]: one frame for the video-shaped VAE
        pixels = pipe.image_processor.preprocess(image, height, width).unsqueeze(2)
        channels = pipe.transformer.config.in_channels // 4
        # the pipeline's own: the image's packed latent tokens (its mode, no noise drawn) (1, h/16 * w/16, c * 4),
        # then the noise's (1, H/16 * W/16, c * 4), in the prompt embeddings' dtype (the text encoder's)
        latents, image_latents = pipe.prepare_latents(pixels, 1, channels, job.height, job.width,
                                                      pipe.text_encoder.dtype, device, generator)
        factor = pipe.vae_scale_factor
        # both grids of the image stream, the noise's then the input's, in (frames, rows, columns) of tokens
        img_shapes = [[(1, job.height // factor // 2, job.width // factor // 2),
                       (1, height // factor // 2, width // factor // 2)]]
        trajectory = self.schedule(pipe, job, latents, img_shapes, device)  # shifted by the noise's tokens
        trajectory.shared["image_latents"] = image_latents
        return trajectory

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        image_latents = trajectory.shared["image_latents"]
        # (b, n, c) + (b, m, c) -> (b, n + m, c): one image stream; the prediction keeps the noise's n tokens
        joined = torch.cat([latents, image_latents.to(latents.dtype)], dim=1)
        return super().predict(pipe, trajectory, joined, t, step, branch)[:, :latents.shape[1]]


@cache
def processor_class():
    """`transformers.Qwen2VLProcessor` where torchvision is installed; without it (its video processor needs it,
    and the class checks for one even when given None) the same class without the video processor: it takes
    images and text, and processes them as Qwen2VLProcessor does."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return Qwen2VLProcessor

    class Qwen2VLImageTextProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"  # Qwen2VLProcessor's defaults
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return Qwen2VLImageTextProcessor


def build_tiny(meta: frozenset[str] = frozenset()):
    """Qwen-Image-Edit: Qwen-Image's tiny transformer, VAE and scheduler (`qwen_image.tiny_components`), a
    two-layer Qwen2.5-VL with a one-block vision tower, and a Qwen2-VL processor (an image processor and a
    tokenizer of the edit template, its vision markers special tokens)."""
    from diffusers import QwenImageEditPipeline
    from transformers import Qwen2VLImageProcessorPil

    from genbatch.models.prompt_tokenizer import template_tokenizer

    probe = QwenImageEditPipeline(None, None, None, None, None, None)  # the prompt template and its crop
    crop = probe.prompt_template_encode_start_idx
    # the pipeline crops the system prompt and the user turn's start: the vision markers and the prompt stay
    head, vision, tail = probe.prompt_template_encode.partition("<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer = template_tokenizer(head + tail.replace("{}", "{}" + vision), crop, probe.tokenizer_max_length + crop)
    processor = processor_class()(image_processor=Qwen2VLImageProcessorPil(**TINY_PROCESSOR), tokenizer=tokenizer)
    vision_ids = {name: tokenizer.convert_tokens_to_ids(f"<|{marker}|>") for name, marker in
                  (("image_token_id", "image_pad"), ("vision_start_token_id", "vision_start"),
                   ("vision_end_token_id", "vision_end"))}
    components = qwen_image.tiny_components(tokenizer, meta, vision_ids)
    return QwenImageEditPipeline(processor=processor, **components)


FAMILY = replace(
    qwen_image.FAMILY,
    name="qwen-image-edit",
    pipelines=("QwenImageEditPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=QwenImageEditHooks(),
    image_encode=ImageEncode(video=False, area=INPUT_AREA, multiple=INPUT_MULTIPLE),
    presets=(TinyPreset(name="tiny-qwen-image-edit", transformer=qwen_image.TINY_TRANSFORMER,
                        vae=qwen_image.TINY_VAE, defaults=TINY_DEFAULTS, build=build_tiny),),
    # Qwen-Image-Edit is Qwen-Image's transformer, VAE and text encoder; its sequence carries the input's tokens
    vae_costs=qwen_image.FAMILY.vae_costs,
    # Qwen-Image-Edit: Qwen-Image's architecture (its read_spec adds the input image's tokens)
    published=(replace(qwen_image.FAMILY.published[0], name="qwen-image-edit", hub_id="Qwen/Qwen-Image-Edit"),),
    teacache=(),
)
