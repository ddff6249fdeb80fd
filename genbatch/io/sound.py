"""Sound in a video: a waveform muxed into the MP4 as an AAC track, with imageio-ffmpeg's bundled ffmpeg.

    Soundtrack(samples, sample_rate)      samples: (channels, n) float in [-1, 1]
    add_sound(mp4, sound)                 -> MP4 bytes: the video stream copied, the sound as AAC at its own rate
    decode_sound(mp4)                     -> the AAC track decoded back (ffmpeg applies the priming edit list)
    streams(mp4)                          -> the kinds of the file's streams, in order ("video", "audio")

The waveform goes to ffmpeg as raw 32-bit float PCM (`-f f32le`), so nothing is lost before the AAC encoder.
AAC codes 1024 samples a frame: the track holds the waveform rounded up to whole frames, and the encoder's
priming (1024 samples) is recorded in the MP4's edit list, which ffmpeg's decoder honours. The audio track is
as long as the waveform (`Soundtrack.seconds`), whatever the video's length.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

AAC_FRAME = 1024
"""Samples in one AAC frame (also the encoder's priming delay)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Soundtrack:
    """A waveform and its sample rate."""

    samples: np.ndarray
    """(channels, n) float samples in [-1, 1]."""
    sample_rate: int
    """Samples a second."""

    def __post_init__(self) -> None:
        samples = np.asarray(self.samples)
        if samples.ndim != 2 or 0 in samples.shape or samples.shape[0] > 8:
            raise ValueError(f"a soundtrack's samples have shape {samples.shape}: pass (channels, samples), 1-8 "
                             "channels")
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate={self.sample_rate} must be positive")

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def seconds(self) -> float:
        """The waveform's duration."""
        return self.samples.shape[1] / self.sample_rate


def _ffmpeg(*args: str) -> subprocess.CompletedProcess:
    import imageio_ffmpeg

    return subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", *args], capture_output=True,
                          check=False)


def _temp(suffix: str) -> str:
    handle, path = tempfile.mkstemp(suffix=suffix, prefix="genbatch-")
    os.close(handle)
    return path


def add_sound(mp4: bytes, sound: Soundtrack, bitrate: str = "128k") -> bytes:
    """`mp4` with `sound` as its AAC audio track (the video stream copied as it is); deterministic."""
    video, pcm, out = _temp(".mp4"), _temp(".f32"), _temp(".mp4")
    try:
        with open(video, "wb") as handle:
            handle.write(mp4)
        # (channels, n) -> (n, channels) interleaved little-endian float32
        interleaved = np.ascontiguousarray(np.clip(sound.samples, -1.0, 1.0).T, dtype="<f4")
        with open(pcm, "wb") as handle:
            handle.write(interleaved.tobytes())
        result = _ffmpeg("-y", "-loglevel", "error", "-i", video, "-f", "f32le", "-ar", str(sound.sample_rate),
                         "-ac", str(sound.channels), "-i", pcm, "-map", "0:v:0", "-map", "1:a:0", "-c:v", "copy",
                         "-c:a", "aac", "-b:a", bitrate, "-movflags", "+faststart", "-fflags", "+bitexact",
                         "-flags:a", "+bitexact", out)
        if result.returncode != 0:
            raise RuntimeError(f"ffmpeg could not mux the sound ({sound.channels} channels at {sound.sample_rate} Hz): "
                               f"{result.stderr.decode(errors='replace')[-500:]}")
        with open(out, "rb") as handle:
            return handle.read()
    finally:
        for path in (video, pcm, out):
            os.unlink(path)


def _probe(path: str) -> str:
    """ffmpeg's description of the file's streams (its stderr with no output named)."""
    return _ffmpeg("-i", path).stderr.decode(errors="replace")


def streams(mp4: bytes) -> list[str]:
    """The kinds of the file's streams in order: "video", "audio", ..."""
    path = _temp(".mp4")
    try:
        with open(path, "wb") as handle:
            handle.write(mp4)
        return [kind.lower() for kind in re.findall(r"Stream #\d+:\d+.*?: (Video|Audio|Data|Subtitle):", _probe(path))]
    finally:
        os.unlink(path)


def decode_sound(mp4: bytes) -> Soundtrack:
    """The MP4's first audio track as float samples (channels, n) at its own rate."""
    path, pcm = _temp(".mp4"), _temp(".f32")
    try:
        with open(path, "wb") as handle:
            handle.write(mp4)
        found = re.search(r"Audio: .*?, (\d+) Hz, (mono|stereo|(\d+) channels)", _probe(path))
        if found is None:
            raise ValueError("the MP4 has no audio track")
        rate = int(found.group(1))
        channels = {"mono": 1, "stereo": 2}.get(found.group(2)) or int(found.group(3))
        result = _ffmpeg("-y", "-loglevel", "error", "-i", path, "-map", "0:a:0", "-f", "f32le", "-ac", str(channels),
                         "-ar", str(rate), pcm)
        if result.returncode != 0:
            raise RuntimeError(f"ffmpeg could not decode the audio: {result.stderr.decode(errors='replace')[-500:]}")
        samples = np.fromfile(pcm, dtype="<f4")
        # (n * channels,) interleaved -> (channels, n)
        return Soundtrack(samples=samples.reshape(-1, channels).T.copy(), sample_rate=rate)
    finally:
        os.unlink(path)
        os.unlink(pcm)
