"""Compiled artifacts reused across runs and ranks: inductor's caches, kept with the run (or at a URL).

`--compile` compiles each block class on the first steps of a process. What it compiled is packed into one
archive per layout, `OUT/compile-cache/<name>` (or `--compile-cache URL/<name>`), by global rank 0 when its
run ends (stopped by a signal included): inductor's local cache directory (`TORCHINDUCTOR_CACHE_DIR`: FX
graphs, AOTAutograd entries and the built kernels, C++ shared objects on CPUs) and torch's mega-cache
(`torch.compiler.save_cache_artifacts`). Every rank of a later run (a requeue, a rerun, another run given the
same `--compile-cache`) unpacks it into its own cache directory before its first step, so its compiles
neither generate nor build code; dynamo still traces each block class. The mega-cache alone is not enough on
CPUs: it holds the generated C++ sources, which gcc then builds again (`bench/compile.py` measures both).

The name carries what the artifacts depend on: torch's version, the backend, the dtype, the device type
and the layout (sequence-parallel blocks compile other graphs than one-process ones).
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

import torch

MEGA_CACHE = "megacache.bin"
"""The archive member holding torch's mega-cache bytes."""


def _inductor_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def _written_since(root: str, since: float) -> list[str]:
    """Files under `root` modified at or after `since` (what this process compiled; the cache directory is
    shared by every process of the machine and keeps everything they ever compiled)."""
    found = []
    for folder, _, names in os.walk(root):
        found += [path for path in (os.path.join(folder, name) for name in names) if os.path.getmtime(path) >= since]
    return found


def pack(since: float) -> bytes | None:
    """What this process compiled since `since` (a `time.time()`) as a .tar.gz; None when nothing was."""
    mega = torch.compiler.save_cache_artifacts()
    root = _inductor_dir()
    files = _written_since(root, since) if os.path.isdir(root) else []
    if (mega is None or not mega[0]) and not files:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in files:
            archive.add(path, arcname=os.path.join("inductor", os.path.relpath(path, root)))
        if mega is not None and mega[0]:
            member = tarfile.TarInfo(MEGA_CACHE)
            member.size = len(mega[0])
            archive.addfile(member, io.BytesIO(mega[0]))
    return buffer.getvalue()


def unpack(data: bytes) -> None:
    """Put an archive's artifacts where this process's compiles look: files into inductor's cache directory
    (each moved into place whole, never over an existing one: ranks of one node unpack side by side), the
    mega-cache loaded."""
    root = _inductor_dir()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive, tempfile.TemporaryDirectory() as scratch:
        archive.extractall(scratch, filter="data")
        for folder, _, names in os.walk(os.path.join(scratch, "inductor")):
            target = os.path.join(root, os.path.relpath(folder, os.path.join(scratch, "inductor")))
            os.makedirs(target, exist_ok=True)
            for name in names:
                if not os.path.exists(os.path.join(target, name)):
                    os.replace(os.path.join(folder, name), os.path.join(target, name))
        mega = os.path.join(scratch, MEGA_CACHE)
        if os.path.exists(mega):
            with open(mega, "rb") as handle:
                torch.compiler.load_cache_artifacts(handle.read())


def artifact_name(*, layout: str, dtype: torch.dtype, device: torch.device, backend: str) -> str:
    """E.g. `torch-2.13.0+cpu-inductor-float32-cpu-single.tar.gz`."""
    return (f"torch-{torch.__version__}-{backend}-{str(dtype).removeprefix('torch.')}-{device.type}-{layout}.tar.gz"
            .replace("/", "_"))


@dataclass(kw_only=True, slots=True)
class CompileCache:
    """One layout's artifacts at `url/name`."""

    url: str
    """The folder (any fsspec URL): `OUT/compile-cache` or `--compile-cache`."""
    name: str
    """`artifact_name(...)`."""
    storage_options: dict = field(default_factory=dict)
    """fsspec options for `url`."""
    loaded: bool = False
    """True once this process loaded artifacts (then it writes none: they are already there)."""
    since: float = field(default_factory=time.time)
    """When the run started: inductor's files written after it are this run's."""

    def _file(self):
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return fs, f"{root.rstrip('/')}/{self.name}"

    def load(self) -> bool:
        """Load the artifacts if they exist (before anything compiles); True when they did."""
        fs, path = self._file()
        if not fs.exists(path):
            return False
        unpack(fs.cat_file(path))
        self.loaded = True
        return True

    def save(self) -> bool:
        """Write what this process compiled (unless it loaded artifacts, or compiled nothing); True if written."""
        if self.loaded:
            return False
        data = pack(self.since)
        if data is None:
            return False
        fs, path = self._file()
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{path}.{id(self):x}.tmp"
        fs.pipe_file(temporary, data)
        fs.mv(temporary, path)  # whole or not at all: a reader never sees half of it
        return True
