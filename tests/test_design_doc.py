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


def _section(title: str) -> str:
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index(f"### {title}")
    end = text.find("\n### ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_row_input_recipe_names_every_file_the_inputs_go_through_and_each_input_has_its_module():
    from genbatch.jobs.inputs import ROW_INPUTS

    section = _section("A per-row input")
    for path in ("genbatch/jobs/inputs/<input>.py", "genbatch/jobs/inputs/__init__.py", "genbatch/jobs/spec.py",
                 "genbatch/runner/prepare_inputs.py", "manifests/schema.py", "manifests/columns.py", "jobs/table.py",
                 "runner/prepare.py"):
        assert f"`{path}`" in section, path
    root = DESIGN.parents[1] / "genbatch" / "jobs" / "inputs"
    for row_input in ROW_INPUTS:  # each declared in its own module, named in no other list
        module = inspect.getmodule(row_input.check)
        assert Path(module.__file__).parent == root, (row_input.name, module.__name__)
        if row_input.prepare is not None:
            where, _, function = row_input.prepare.partition(":")
            assert where == "genbatch.runner.prepare_inputs", row_input.prepare
            import importlib

            assert callable(getattr(importlib.import_module(where), function)), row_input.prepare
    # "at most four more files": the recipe's numbered list has its own module and four others
    assert re.findall(r"^(\d)\. ", section, re.M) == ["1", "2", "3", "4", "5"]


def test_the_axis_recipe_lists_six_files_and_names_every_field_of_the_axis_table():
    from dataclasses import fields

    from genbatch.parallel.axes import Axis

    section = _section("A parallel method on a new mesh axis")
    assert section.splitlines()[1].startswith("Six existing files")
    files = re.findall(r"^\d\. `(genbatch/[\w/.]+)`", section, re.M)
    assert len(files) == 6, files
    words = {"name": "name", "short": "heading", "collective": "collective kind", "what": "flag help",
             "help": "flag help", "aliases": "spellings", "max_degree": "largest degree",
             "fsdp_shards": "FSDP shards over it", "stale": "composes with", "alone_with": "composes with",
             "with_fsdp": "composes with", "why_alone": "composes with"}
    assert {field.name for field in fields(Axis)} == set(words), "a new Axis field: say what it is in the recipe"
    assert all(word in " ".join(section.split()) for word in words.values())


def test_the_family_recipe_is_two_files():
    section = _section("A model family")
    assert re.findall(r"^\d\. `(genbatch/[\w/.<>]+)`", section, re.M) == ["genbatch/models/<family>.py",
                                                                         "genbatch/models/registry.py"]


def test_plan_names_the_planners_work_alone():
    """Section 7: outside the planner, no name in genbatch/ says "plan" but the planner's own (its package, `gen
    plan`'s command) and diffusers' tables (`_cp_plan`, `_tp_plan`)."""
    import tokenize

    allowed = {"planner", "plan_command", "_cp_plan", "_tp_plan"}
    root = Path(__file__).resolve().parents[1] / "genbatch"
    found = set()
    for path in root.rglob("*.py"):
        if "planner" in path.relative_to(root).parts:
            continue
        with open(path, "rb") as handle:
            found |= {(token.string, path.name) for token in tokenize.tokenize(handle.readline)
                      if token.type == tokenize.NAME and "plan" in token.string.lower()
                      and token.string not in allowed}
    # --layout auto asks the planner for its plan: the one use outside the package
    assert found == {("plan", "auto_layout.py")}
    assert "## 7. Words" in DESIGN.read_text() and "| plan | the planner's recommendation" in DESIGN.read_text()
