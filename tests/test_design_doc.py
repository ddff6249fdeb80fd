"""docs/design.md stays true to the tree: every genbatch path it names exists, and its hook table names every
method of the per-job hook protocol and every feature `parallel/features.py` starts."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from genbatch.parallel.features import FEATURES
from genbatch.parallel.job_hooks import JobHook

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def test_every_path_the_design_names_exists():
    text = DESIGN.read_text(encoding="utf-8")
    named = set(re.findall(r"`(genbatch/[\w/.<>-]+)`", text)) | set(re.findall(r"`((?:parallel|runner|models)/[\w/.-]+)`", text))
    missing = [path for path in sorted(named) if "<" not in path and not (
        (DESIGN.parents[1] / path).exists() or (DESIGN.parents[1] / "genbatch" / path).exists())]
    assert named and not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_the_hook_table_covers_the_protocol_and_the_features():
    text = DESIGN.read_text(encoding="utf-8")
    methods = [name for name, _ in inspect.getmembers(JobHook, inspect.isfunction) if not name.startswith("_")]
    assert methods and all(f"`{name}(" in text for name in methods), methods
    for name, _ in FEATURES:
        words = {"step cache": "step cach", "pipefusion": "PipeFusion", "distrifusion": "DistriFusion"}.get(name, name)
        assert words in text, name
