"""A Hugging Face hub cache laid out as huggingface_hub lays it out, filled from a local pipeline directory.

    models--org--name/blobs/<sha256>                      file contents, by hash
    models--org--name/snapshots/<commit>/<path>           relative symlinks to ../../blobs/<sha256>
    models--org--name/refs/<branch or tag>                the commit that branch or tag names
"""

from __future__ import annotations

import hashlib
import os


def cache_repo_dir(cache: str, repo: str) -> str:
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def add_snapshot(cache: str, repo: str, source: str, commit: str, refs: tuple[str, ...] = ("main",)) -> str:
    """Put the files of directory `source` into `cache` as `repo` at `commit` (40 hex digits), named by `refs`;
    returns the snapshot directory."""
    assert len(commit) == 40, "huggingface_hub takes only 40-digit commit hashes as commits"
    root = cache_repo_dir(cache, repo)
    snapshot = os.path.join(root, "snapshots", commit)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    for folder, _, files in os.walk(source):
        for file in files:
            relative = os.path.relpath(os.path.join(folder, file), source)
            with open(os.path.join(folder, file), "rb") as handle:
                data = handle.read()
            blob = os.path.join(root, "blobs", hashlib.sha256(data).hexdigest())
            if not os.path.exists(blob):
                with open(blob, "wb") as handle:
                    handle.write(data)
            link = os.path.join(snapshot, relative)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    for ref in refs:
        with open(os.path.join(root, "refs", ref), "w", encoding="utf-8") as handle:
            handle.write(commit)
    return snapshot
