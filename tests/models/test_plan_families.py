"""`gen plan` knows Qwen-Image and HunyuanVideo by their published shapes (the planner's and the family
modules' agree) and their tiny presets through their specs; cfg layouts only for Qwen-Image (true CFG)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.planner.shapes import resolve_shape


@pytest.mark.parametrize(("preset", "tokens", "cfg"), [("tiny-qwen-image", 16 + 256, True),
                                                       ("tiny-hunyuan-video", 3 * 3 * 4 + 256, False)])
def test_tiny_presets_plan(preset, tokens, cfg):
    shape = resolve_shape(preset)
    assert shape.joint_text and shape.uses_cfg == cfg and shape.num_heads == 4
    result = CliRunner().invoke(main, ["plan", "--model", preset, "--gpus", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["workload"]["tokens"] == tokens  # text tokens join the image tokens in attention
    assert any(layout["cfg"] == 2 for layout in data["layouts"]) == cfg
