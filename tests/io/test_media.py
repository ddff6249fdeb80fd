from __future__ import annotations

import numpy as np
import pytest

from genbatch.io import decode_mp4, decode_png, encode_mp4, encode_png


def _smooth_frames(count: int, height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    frames = []
    for t in range(count):
        red = 128 + 100 * np.sin(x / 9.0 + t / 3.0)
        green = 128 + 100 * np.cos(y / 7.0 - t / 4.0)
        blue = np.full_like(red, 60 + 10 * t)
        frames.append(np.stack([red, green, blue], axis=-1))
    return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


def test_png_is_lossless():
    image = np.random.default_rng(0).integers(0, 256, (37, 51, 3), dtype=np.uint8)
    data = encode_png(image)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(decode_png(data), image)


@pytest.mark.parametrize("height, width", [(64, 96), (33, 47)])
def test_mp4_roundtrip_h264_yuv420p(height, width):
    frames = _smooth_frames(9, height, width)
    data = encode_mp4(frames, fps=16)
    assert data[4:8] == b"ftyp" and b"avc1" in data[:4096]  # H.264 in MP4, moov first (faststart)
    decoded = decode_mp4(data)
    even_h, even_w = height + height % 2, width + width % 2
    assert decoded.shape == (9, even_h, even_w, 3)
    error = np.abs(decoded[:, :height, :width].astype(int) - frames.astype(int)).mean()
    assert error < 4.0, error


def test_mp4_is_deterministic_and_keeps_fps():
    frames = _smooth_frames(5, 32, 32)
    assert encode_mp4(frames, fps=8) == encode_mp4(frames, fps=8)
    assert encode_mp4(frames, fps=8) != encode_mp4(frames, fps=24)


def _mp4(frames):
    return encode_mp4(frames, fps=8)


@pytest.mark.parametrize("encode, bad, message", [
    (encode_png, np.zeros((4, 4, 3), np.float32), "uint8"),
    (encode_png, np.zeros((4, 4), np.uint8), "shape"),
    (_mp4, np.zeros((2, 4, 4, 3), np.float32), "uint8"),
    (_mp4, np.zeros((4, 4, 3), np.uint8), "shape"),
    (_mp4, np.zeros((0, 4, 4, 3), np.uint8), "empty"),
])
def test_bad_pixels_name_the_fix(encode, bad, message):
    with pytest.raises(ValueError, match=message):
        encode(bad)


def test_bad_fps_and_crf():
    frames = _smooth_frames(2, 16, 16)
    with pytest.raises(ValueError, match="fps"):
        encode_mp4(frames, fps=0)
    with pytest.raises(ValueError, match="crf"):
        encode_mp4(frames, fps=8, crf=60)
