"""Thumbnails, posters and video previews: made once per output, kept in the report, reused after.

    made = make_previews(jobs, store, destination, thumb_px=256, preview_px=320, workers=8)
    made.media[job.id]  ->  Media(thumb="thumbs/<id>-<sha>.jpg")                         an image
                            Media(thumb="posters/<id>-<sha>.jpg", video="videos/<id>-<sha>.mp4")   a video

An image's thumbnail is a JPEG (Pillow) of at most thumb_px a side. A video gets, from one ffmpeg call (the one
imageio-ffmpeg ships), its first frame as the poster and an H.264 copy (yuv420p, faststart, at most preview_px
wide) that every browser plays. File names carry the output's SHA-256, so a later report of the same run lists
each folder once and makes only what is missing; a job redone into a new output gets new files.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from genbatch.io.layout import encode_id

FOLDERS = ("thumbs", "posters", "videos")
"""The report's media folders."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Media:
    """What the report shows of one done job's output: paths relative to the report's folder."""

    thumb: str | None = None
    """The image's thumbnail, or the video's poster."""
    video: str | None = None
    """The video's H.264 preview (None for an image)."""
    sound: bool = False
    """True when the preview carries the video's sound (AAC), which the page plays."""
    problem: str | None = None
    """Why there is no preview (the output is missing, or could not be decoded)."""


@dataclass(kw_only=True, slots=True)
class Previews:
    """What make_previews did."""

    media: dict[str, Media] = field(default_factory=dict)
    """Per done job id, its media."""
    made: int = 0
    """Outputs whose previews this call made."""
    reused: int = 0
    """Outputs whose previews an earlier report had made."""
    failed: int = 0
    """Outputs that could not be previewed (each with its Media.problem)."""


def media_for(job) -> Media:
    """The names a done job's previews have in the report (whether or not they exist yet)."""
    key = f"{encode_id(job.id)}-{(job.output_sha256 or 'unhashed')[:16]}"
    if job.is_video:
        return Media(thumb=f"posters/{key}.jpg", video=f"videos/{key}.mp4", sound=job.has_sound)
    return Media(thumb=f"thumbs/{key}.jpg")


def thumbnail_jpeg(data: bytes, size: int) -> bytes:
    """A JPEG of the image in `data` (PNG, JPEG, ...) with its longer side at most `size` pixels."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (size, size))  # JPEG sources decode straight at a reduced scale
        image = image.convert("RGB")
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=85)
        return out.getvalue()


def video_previews(data: bytes, thumb_px: int, preview_px: int, sound: bool = False) -> tuple[bytes, bytes]:
    """(poster JPEG, H.264 MP4 preview) of the MP4 in `data`, from one ffmpeg run; with `sound`, the preview keeps
    the video's sound track (AAC)."""
    import imageio_ffmpeg

    poster_scale = (f"scale=w='min({thumb_px},iw)':h='min({thumb_px},ih)':force_original_aspect_ratio=decrease,"
                    "scale=trunc(iw/2)*2:trunc(ih/2)*2")
    preview_scale = f"scale=trunc(min({preview_px}\\,iw)/2)*2:-2"
    with tempfile.TemporaryDirectory(prefix="genbatch-report-") as folder:
        source, poster, preview = (os.path.join(folder, name) for name in ("in.mp4", "poster.jpg", "preview.mp4"))
        with open(source, "wb") as handle:
            handle.write(data)
        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-i", source,
            "-map", "0:v:0", "-frames:v", "1", "-vf", poster_scale, "-q:v", "3", poster,
            "-map", "0:v:0", *(["-map", "0:a:0", "-c:a", "aac", "-b:a", "96k"] if sound else ["-an"]),
            "-vf", preview_scale, "-c:v", "libx264", "-pix_fmt", "yuv420p",
            "-preset", "veryfast", "-crf", "26", "-movflags", "+faststart", preview,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise ValueError(f"ffmpeg could not read the video: {result.stderr.strip()[-300:]}")
        with open(poster, "rb") as first, open(preview, "rb") as second:
            return first.read(), second.read()


def _make(job, media: Media, store, destination, thumb_px: int, preview_px: int) -> str | None:
    """Make one job's previews; None when made, else why not."""
    data = store.objects.read(store.layout.output(job.id, job.output_ext))
    if data is None:
        return f"its output outputs/{encode_id(job.id)}.{job.output_ext} is missing from the run"
    try:
        if media.video:
            poster, preview = video_previews(data, thumb_px, preview_px, sound=media.sound)
            destination.write(media.video, preview)
            destination.write(media.thumb, poster)
        else:
            destination.write(media.thumb, thumbnail_jpeg(data, thumb_px))
    except (OSError, ValueError, subprocess.SubprocessError) as error:  # PIL's UnidentifiedImageError: OSError
        return f"its output could not be previewed ({type(error).__name__}: {error})"
    return None


def make_previews(jobs, store, destination, *, thumb_px: int, preview_px: int, workers: int) -> Previews:
    """Previews of every done job with an output (`store`: the run's RunStore; `destination`: the report's)."""
    existing = {folder: destination.names(folder) for folder in FOLDERS}

    def present(name: str | None) -> bool:
        return name is None or name.split("/", 1)[1] in existing[name.split("/", 1)[0]]

    done = Previews()
    todo = []
    for job in jobs:
        if job.status != "done" or not job.output_ext:
            continue
        media = media_for(job)
        if present(media.thumb) and present(media.video):
            done.media[job.id] = media
            done.reused += 1
        else:
            todo.append((job, media))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="genbatch-report") as pool:
        problems = pool.map(lambda item: _make(*item, store, destination, thumb_px, preview_px), todo)
        for (job, media), problem in zip(todo, problems, strict=True):
            if problem is None:
                done.media[job.id] = media
                done.made += 1
            else:
                done.media[job.id] = Media(problem=problem)
                done.failed += 1
    return done
