"""Media encoding: PNG for images, H.264 MP4 (yuv420p, imageio-ffmpeg's bundled ffmpeg) for videos.

    encode_png(image)             image: (H, W, 3) uint8                 -> PNG bytes (lossless)
    encode_mp4(frames, fps=16)    frames: (F, H, W, 3) uint8             -> MP4 bytes
    encode_mp4(frames, fps, sound=Soundtrack(...))                        -> MP4 bytes with an AAC track
    decode_png(data) / decode_mp4(data)   back to arrays, for checks and tests
    h264_still(image, crf)        image: (H, W, 3) uint8 -> the same image through one H.264 frame (yuv420p)

yuv420p halves the chroma planes, so H.264 needs even sizes: odd widths/heights are padded by one
replicated edge pixel (a 33x17 video comes back as 34x18, its last row/column repeating the edge).
Encoding is deterministic: the same frames give the same bytes.
"""

from __future__ import annotations

import io
import os
import tempfile

import imageio_ffmpeg
import numpy as np
from PIL import Image

from genbatch.io.sound import Soundtrack, add_sound


def _check_pixels(array: np.ndarray, ndim: int, what: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != ndim or array.shape[-1] != 3:
        layout = "(H, W, 3)" if ndim == 3 else "(F, H, W, 3)"
        raise ValueError(f"{what} has shape {array.shape}: pass {layout} RGB")
    if array.dtype != np.uint8:
        raise ValueError(
            f"{what} has dtype {array.dtype}: convert to uint8 first, e.g. (x.clip(0, 1) * 255).round().astype(np.uint8)"
        )
    if 0 in array.shape:
        raise ValueError(f"{what} has shape {array.shape}: it is empty")
    return np.ascontiguousarray(array)


def encode_png(image: np.ndarray, compress_level: int = 6) -> bytes:
    """Lossless PNG of an (H, W, 3) uint8 image."""
    image = _check_pixels(image, 3, "image")
    buffer = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 pixels of PNG bytes."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def _pad_even(frames: np.ndarray) -> np.ndarray:
    _, height, width, _ = frames.shape
    pad_h, pad_w = height % 2, width % 2
    if not (pad_h or pad_w):
        return frames
    # (F, H, W, 3) -> (F, H + H%2, W + W%2, 3), edge pixels repeated
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def encode_mp4(frames: np.ndarray, fps: int | float, crf: int = 18, preset: str = "medium",
               sound: Soundtrack | None = None) -> bytes:
    """H.264 MP4 (yuv420p, faststart) of (F, H, W, 3) uint8 frames at `fps`; odd sizes padded to even. `sound`:
    muxed in as the file's AAC track (`genbatch.io.sound`)."""
    frames = _pad_even(_check_pixels(frames, 4, "frames"))
    if not fps or fps <= 0:
        raise ValueError(f"fps={fps!r} must be positive: set the manifest's fps column or the model default")
    if not 0 <= crf <= 51:
        raise ValueError(f"crf={crf} must be in 0..51 (lower is better quality; 18 is visually lossless)")
    _, height, width, _ = frames.shape
    handle, path = tempfile.mkstemp(suffix=".mp4", prefix="genbatch-")
    os.close(handle)
    try:
        writer = imageio_ffmpeg.write_frames(
            path, (width, height), fps=fps, codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
            quality=None, macro_block_size=1, ffmpeg_log_level="error",
            output_params=["-crf", str(crf), "-preset", preset, "-movflags", "+faststart",
                           "-fflags", "+bitexact", "-flags:v", "+bitexact"],
        )
        writer.send(None)  # start ffmpeg
        try:
            for frame in frames:
                writer.send(frame)
        finally:
            writer.close()
        with open(path, "rb") as encoded:
            video = encoded.read()
        return video if sound is None else add_sound(video, sound)
    finally:
        os.unlink(path)


def decode_mp4(data: bytes) -> np.ndarray:
    """(F, H, W, 3) uint8 frames of MP4 bytes."""
    handle, path = tempfile.mkstemp(suffix=".mp4", prefix="genbatch-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        reader = imageio_ffmpeg.read_frames(path, pix_fmt="rgb24")
        meta = next(reader)
        width, height = meta["size"]
        frames = [np.frombuffer(raw, np.uint8).reshape(height, width, 3) for raw in reader]
        # F x (H, W, 3) -> (F, H, W, 3)
        return np.stack(frames)
    finally:
        os.unlink(path)


def h264_still(image: np.ndarray, crf: int, preset: str = "veryfast") -> np.ndarray:
    """`image` (H, W, 3) uint8 encoded as a one-frame H.264 video (libx264 at `crf`, yuv420p) and decoded back: the
    compression a model conditioned on video frames was trained against (LTX-2's image conditioning). Odd sizes
    are cropped to even ones first, as H.264 needs; crf 0 returns the image as it is."""
    image = _check_pixels(image, 3, "image")
    if crf == 0:
        return image
    height, width = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    return decode_mp4(encode_mp4(image[None, :height, :width], fps=1, crf=crf, preset=preset))[0]
