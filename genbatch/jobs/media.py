"""A row's input media, named by URL: which columns carry them, and where a relative one points.

    image       the conditioning image (image-to-video's first frame, an edit's input)
    last_image  first-and-last-frame video's last frame

A value is a path or any fsspec URL. A relative path is taken relative to the manifest's own location
(`media_url`), so a manifest and its images move together. Nothing is read here: the rank that runs a job
reads its media once (`genbatch.io.media_input`).
"""

from __future__ import annotations

import posixpath

MEDIA_COLUMNS = ("image", "last_image")
"""The manifest columns that name a row's input media, in the order messages list them."""


def manifest_base(manifest_url: str) -> str:
    """The location relative media paths are taken from: the manifest's directory (or bucket prefix)."""
    protocol, sep, path = str(manifest_url).rpartition("://")
    if not sep:
        import os

        return os.path.dirname(os.path.abspath(manifest_url))
    return f"{protocol}://{posixpath.dirname(path)}"


def media_url(value: str, base: str | None) -> str:
    """`value` as an absolute URL: kept when it is a URL or an absolute path, else joined to `base` (the
    manifest's directory) and normalised."""
    text = value.strip()
    if "://" in text or text.startswith("/") or base is None:
        return text
    protocol, sep, path = base.rpartition("://")
    joined = posixpath.normpath(posixpath.join(path if sep else base, text))
    return f"{protocol}://{joined}" if sep else joined
