"""`gen models`: every name `--model` takes, as text and as JSON records, against the registry it is built from (the
families' presets and published models, the planner's planned-only shapes); `gen plan` prices every listed name
and every hub id (a hub id as its published model); docs/models.md holds the list as `gen models` prints it; and
listing imports no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from genbatch.models import families
from genbatch.planner.shapes import PUBLISHED
from tests.support.runs import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _registry() -> dict[str, tuple[str, str | None]]:
    """{name: (kind, hub id)} straight from the records `gen models` lists."""
    names: dict[str, tuple[str, str | None]] = {}
    for family in families().values():
        names.update({preset.name: ("preset", None) for preset in family.presets})
        names.update({model.name: ("published", model.hub_id) for model in family.published})
    for name, shape in PUBLISHED.items():
        names.setdefault(name, ("plan only", shape.hub_id))
    return names


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """`gen models --json`, run in a fresh interpreter that must not import torch."""
    code = ("import sys; from genbatch.cli import main\n"
            "main(['models', '--json'], standalone_mode=False)\n"
            "assert 'torch' not in sys.modules, 'gen models imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_json_records_are_the_registry(records):
    registry = _registry()
    assert [record["name"] for record in records] == list(dict.fromkeys(record["name"] for record in records))
    assert {record["name"]: (record["kind"], record["hub_id"]) for record in records} == registry
    assert {record["name"] for record in records if record["kind"] == "plan only"} == {"cogvideox-5b",
                                                                                        "cogvideox1.5-5b"}
    for record in records:
        assert set(record) == {"name", "kind", "family", "hub_id", "task", "guidance", "guidance_scale", "width",
                               "height", "frames", "steps"}
        assert record["width"] and record["height"] and record["steps"], record


@pytest.mark.parametrize(("name", "family", "task", "guidance", "scale", "size"), [
    ("tiny-wan", "wan", "text-to-video", "CFG", 5.0, (64, 48, 9)),
    ("wan2.1-14b", "wan", "text-to-video", "CFG", 5.0, (1280, 720, 81)),
    ("tiny-wan-i2v", "wan-i2v", "image-to-video", "CFG", 5.0, (64, 48, 9)),
    ("tiny-wan-flf2v", "wan-i2v", "first/last-frame-to-video", "CFG", 5.0, (64, 48, 9)),
    ("tiny-wan22-ti2v", "wan-i2v", "text/image-to-video", "CFG", 5.0, (64, 64, 9)),
    ("flux.1-dev", "flux", "text-to-image", "embedded", 3.5, (1024, 1024, None)),
    ("flux.1-kontext-dev", "flux-kontext", "text/image-to-image", "embedded", 3.5, (1024, 1024, None)),
    ("qwen-image", "qwen-image", "text-to-image", "true CFG", 4.0, (1024, 1024, None)),
    ("qwen-image-edit", "qwen-image-edit", "image-to-image", "true CFG", 4.0, (1024, 1024, None)),
    ("z-image-turbo", "z-image", "text-to-image", "distilled", 0.0, (1024, 1024, None)),
    ("flux.2-klein", "flux2-klein", "text/image-to-image", "distilled", 4.0, (1024, 1024, None)),
    ("flux.2-klein-base", "flux2-klein", "text/image-to-image", "CFG", 4.0, (1024, 1024, None)),
    ("hunyuanvideo", "hunyuan-video", "text-to-video", "embedded", 6.0, (1280, 720, 129)),
    ("ltx-2", "ltx2", "text-to-video+sound", "CFG", 3.0, (768, 512, 121)),
    ("tiny-ltx2-i2v", "ltx2-i2v", "image-to-video+sound", "CFG", 3.0, (96, 64, 9)),
    ("cogvideox-5b", "cogvideox", "text-to-video", "CFG", None, (720, 480, 49)),
])
def test_task_guidance_and_size_follow_the_spec(records, name, family, task, guidance, scale, size):
    record = next(record for record in records if record["name"] == name)
    assert (record["family"], record["task"], record["guidance"], record["guidance_scale"]) == (family, task,
                                                                                                guidance, scale)
    assert (record["width"], record["height"], record["frames"]) == size


def _table(text: str) -> list[str]:
    return text[:text.index("\n\n")].splitlines()


def test_the_text_table_lists_every_name_and_hub_id_in_100_columns(records):
    result = run_cli("models")
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 100
    table = _table(result.stdout)
    rows = {line.split()[0]: line for line in table[1:] if line.startswith("  ") and not line.startswith("    ")}
    assert list(rows) == [record["name"] for record in records]
    for record in records:
        row = rows[record["name"]]
        for cell in (record["kind"], record["task"], record["guidance"]):
            assert f"  {cell}" in row, (cell, row)
        following = table[table.index(row) + 1]
        assert (following == f"    hub id {record['hub_id']}") == bool(record["hub_id"]), following
    headings = [line for line in table if not line.startswith("  ")]
    assert [heading.split()[0] for heading in headings] == list(dict.fromkeys(record["family"] for record in records))


def test_docs_models_page_holds_the_list_as_gen_models_prints_it():
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    section = page[page.index("## The names"):]
    block = re.search(r"```\n(.*?)```", section, flags=re.S)
    printed = run_cli("models").stdout
    assert block is not None and block.group(1) == printed, (
        "docs/models.md's list under 'The names' is not what `gen models` prints: replace the code block there "
        "with the output of `gen models`")


def test_gen_plan_prices_every_name_and_every_hub_id_as_its_published_model(records):
    for record in records:
        by_name = run_cli("plan", "-m", record["name"], "-g", "2", "--json")
        assert by_name.returncode == 0, (record["name"], by_name.stderr)
        if record["hub_id"]:
            by_id = run_cli("plan", "-m", record["hub_id"], "-g", "2", "--json")
            assert by_id.returncode == 0, (record["hub_id"], by_id.stderr)
            assert by_id.stdout.replace(record["hub_id"], record["name"]) == by_name.stdout, record["hub_id"]
