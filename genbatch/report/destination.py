"""The report's folder, on a local path or any fsspec URL: whole-file writes and one listing per folder.

A file is written whole (local: a temp file beside it, then a rename; object stores: one PUT), so a report
killed half-way leaves no half thumbnail that a later report would take as made. Unlike the run's own files
nothing is fsynced: a report is made again from the run at any time, and 100k thumbnails must not each wait
for the disk.
"""

from __future__ import annotations

import os
import uuid

from fsspec.implementations.local import LocalFileSystem


class Destination:
    """Where one report's files go."""

    def __init__(self, url: str, storage_options: dict | None = None, timeout_s: float | None = None):
        from genbatch.io.options import open_filesystem

        self.fs, self.root, self.url = open_filesystem(url, storage_options, timeout_s=timeout_s)
        self.local = isinstance(self.fs, LocalFileSystem)
        self._made: set[str] = set()

    def path(self, name: str) -> str:
        """The filesystem path of `name` (relative, `/`-separated) inside the report."""
        return f"{self.root}/{name}"

    def write(self, name: str, data: bytes) -> None:
        """Write the file `name` (e.g. `thumbs/fox-1a2b.jpg`) whole."""
        path = self.path(name)
        if not self.local:
            self.fs.pipe_file(path, bytes(data))
            return
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        temp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    def names(self, folder: str) -> set[str]:
        """The names of the files directly in `folder` of the report (one listing; temp files left out)."""
        path = self.path(folder)
        try:
            if self.local:
                with os.scandir(path) as entries:
                    return {entry.name for entry in entries if entry.is_file() and not entry.name.startswith(".")}
            listed = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return set()
        names = (entry.rstrip("/").rsplit("/", 1)[-1] for entry in listed)
        return {name for name in names if name and not name.startswith(".")}
