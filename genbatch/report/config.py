"""What `gen report` is asked for: the run, where the report goes, and its limits."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PAGE_SIZE = 200
"""The most jobs one page of the gallery shows."""


@dataclass(kw_only=True, slots=True)
class ReportOptions:
    """One report of one run folder."""

    out: str
    """The run folder (a path or any fsspec URL), as given to `gen run --out`."""
    to: str | None = None
    """Where the report goes (a path or any fsspec URL); None: OUT/report."""
    page_size: int = MAX_PAGE_SIZE
    """Jobs per page, at most MAX_PAGE_SIZE."""
    thumb_px: int = 256
    """The longest side of an image's thumbnail and a video's poster, in pixels (smaller media keep their size)."""
    preview_px: int = 320
    """The most pixels a video preview is wide (the H.264 copy the page plays)."""
    workers: int = 8
    """Threads reading outputs and making thumbnails, posters and previews."""
    storage_options: dict = field(default_factory=dict)
    """fsspec options for the run's and the report's filesystems (endpoint, credentials, ...)."""
    storage_timeout: float = 120.0
    """Seconds one read of the run may keep failing, every retry included, before the report gives up."""

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size={self.page_size} must be in 1..{MAX_PAGE_SIZE}: pages stay light to open")
        if self.thumb_px < 16 or self.preview_px < 16:
            raise ValueError(f"thumb_px={self.thumb_px} and preview_px={self.preview_px} must be at least 16 pixels")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be at least 1")

    @property
    def destination(self) -> str:
        """The report's folder URL: `to`, or OUT/report."""
        return self.to if self.to else self.out.rstrip("/") + "/report"
