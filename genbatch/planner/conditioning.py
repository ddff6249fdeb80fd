"""What an image-conditioned job's VAE encodes before it denoises: whether the model takes an image, and the
pixels and frames its encoder sees.

    encode_input(resolve_shape("wan2.1-i2v-14b"), width=1280, height=720, frames=81)
    # EncodeInput(width=1280, height=720, frames=81, what='conditioning video')

Each family encodes as its diffusers pipeline does (the family modules' docstrings):
- Wan 2.1/2.2 I2V and FLF2V (`WanImageToVideoPipeline`): the conditioning video (the first frame, zeros, the
  last frame) at the output's size and frames. Wan 2.2 TI2V (in channels = out channels, the image optional):
  the image alone, at the output's size, as the first latent frame.
- FLUX.1 Kontext (`FluxKontextPipeline`): the input image, resized to the preferred resolution (about a
  megapixel) nearest its aspect ratio; a model whose defaults carry `auto_resize: 0` keeps the image's size.
- Qwen-Image-Edit (`QwenImageEditPipeline`): the input image at `input_area` (a megapixel) at its aspect ratio,
  each side a multiple of 32.
- HunyuanVideo I2V (`HunyuanVideoImageToVideoPipeline`): the image alone, one frame at the output's size.

The planner does not see the images, so it takes the input's aspect ratio for the output's (`gen plan
--input-size WxH` gives the resized input instead). Each family says how it encodes on its record
(`ModelFamily.image_encode`), and a shape (a `ModelSpec`) which media its rows take.
"""

from __future__ import annotations

import math

from genbatch.models import families
from genbatch.models.shapes import ImageEncode, ModelShape
from genbatch.planner.workload import EncodeInput


def _model_encodes(shape: ModelShape) -> ImageEncode | None:
    """How the rows of the model of `shape` encode an image: its family's way (`ModelFamily.image_encode`), with
    what its spec says (which media it takes, whether they are required, its defaults' input area); None when it
    takes no image."""
    if not shape.media_inputs:
        return None
    record = families().get(shape.family)
    encodes = (record.image_encode if record is not None else None) or ImageEncode(video=shape.is_video)
    required = bool(shape.media_required)
    area = int(shape.defaults["input_area"]) if "input_area" in shape.defaults else encodes.area
    if shape.defaults.get("auto_resize") == 0:
        area = None  # the image's own size: taken at the output's
    # Wan 2.2 TI2V: the image is optional and replaces the first latent frame, so only it is encoded
    return ImageEncode(video=encodes.video and required, area=area, multiple=encodes.multiple, required=required)


def resized(width: int, height: int, area: int, multiple: int) -> tuple[int, int]:
    """(width, height) of an image of `width` x `height`'s aspect ratio resized to about `area` pixels, each side
    rounded to the nearest multiple of `multiple` (Qwen-Image-Edit's `calculate_dimensions`)."""
    ratio = width / height
    new_width = max(multiple, round(math.sqrt(area * ratio) / multiple) * multiple)
    new_height = max(multiple, round(new_width / ratio / multiple) * multiple)
    return new_width, new_height


def encode_input(shape: ModelShape, *, width: int, height: int, frames: int | None, image: bool | None = None,
                 input_size: tuple[int, int] | None = None) -> EncodeInput | None:
    """What the VAE of the model of `shape` encodes for a job of `width` x `height` (x `frames`), or None when the job starts from
    noise alone. `image`: whether the jobs carry an image (None: the model's way, with one if it takes one);
    `input_size`: the resized input image's (width, height) instead of the one derived from the output's size."""
    encodes = _model_encodes(shape)
    if encodes is None:
        if image:
            raise ValueError(f"{shape.name} takes no image (it generates from text alone); drop --image")
        if input_size is not None:
            raise ValueError(f"--input-size applies to a model that takes an image; {shape.name} takes none")
        return None
    if image is False:
        if encodes.required:
            raise ValueError(f"every row of {shape.name} starts from an image; drop --no-image")
        if input_size is not None:
            raise ValueError("--input-size describes the input image; drop it with --no-image")
        return None
    if encodes.video:
        if input_size is not None:
            raise ValueError(f"{shape.name} resizes its image to the output's size; drop --input-size")
        return EncodeInput(width=width, height=height, frames=frames, what="conditioning video")
    if input_size is not None:
        in_width, in_height = input_size
        if in_width < 1 or in_height < 1:
            raise ValueError(f"--input-size {in_width}x{in_height} must be at least 1x1")
    elif encodes.area is not None:
        in_width, in_height = resized(width, height, encodes.area, encodes.multiple)
    else:
        in_width, in_height = width, height
    what = "first frame" if shape.is_video else "input image"
    return EncodeInput(width=in_width, height=in_height, frames=None, what=what)


__all__ = ["encode_input", "resized"]
