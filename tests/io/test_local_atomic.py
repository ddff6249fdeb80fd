"""Local-disk specifics: temp file + rename/link, clean-up on error, removal of killed writers' temps."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genbatch.io import RunStore, StorageError
from genbatch.io import objects as objects_module


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _break(monkeypatch, name: str, error: OSError) -> None:
    """Make os.<name> (as objects.py calls it) fail with `error`."""
    def broken(*args):
        raise error

    monkeypatch.setattr(objects_module.os, name, broken)


def test_failed_rename_leaves_nothing(tmp_path, monkeypatch):
    store = RunStore(str(tmp_path / "run"))
    _break(monkeypatch, "replace", OSError(28, "No space left on device"))
    with pytest.raises(StorageError, match="write .*outputs/j.png"):
        store.commit("j", b"media", "png", {})
    assert _files(tmp_path) == [] and store.done_ids() == set()


def test_failed_marker_link_leaves_output_but_not_done(tmp_path, monkeypatch):
    store = RunStore(str(tmp_path / "run"))
    _break(monkeypatch, "link", OSError(5, "I/O error"))
    with pytest.raises(StorageError, match="create .*done/j.json"):
        store.commit("j", b"media", "png", {})
    assert _files(tmp_path / "run") == ["outputs/j.png"]  # whole output, no marker: the rerun redoes it
    assert store.done_ids() == set()


def test_stale_temps_of_dead_writers_are_removed(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    store.commit("j", b"media", "png", {})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    host = socket.gethostname()
    folder = tmp_path / "run" / "outputs"
    dead_temp = folder / f".k.png.tmp-{host}-{dead.stdout.strip()}-abcd1234"
    live_temp = folder / f".l.png.tmp-{host}-{os.getpid()}-abcd1234"
    old_temp = folder / ".m.png.tmp-otherhost-1-abcd1234"
    other_host = folder / ".n.png.tmp-otherhost-1-abcd1234"
    for path in (dead_temp, live_temp, old_temp, other_host):
        path.write_bytes(b"partial")
    os.utime(old_temp, (time.time() - 7200, time.time() - 7200))
    assert store.remove_stale_temps(older_than_s=3600) == 2
    assert sorted(p.name for p in folder.iterdir()) == sorted(["j.png", live_temp.name, other_host.name])


def test_marker_and_output_listings_ignore_temps(tmp_path):
    store = RunStore(str(tmp_path / "run"))
    store.commit("a", b"media", "png", {})
    (tmp_path / "run" / "done" / ".b.json.tmp-h-1-x").write_bytes(b"{}")
    assert store.done_ids() == {"a"}
