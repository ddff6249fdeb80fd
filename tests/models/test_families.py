"""The families' data: every name it gives exists on the real modules, the sequence-parallel routing is built
from it, FSDP finds the blocks through it, the VAE rules cover the decoders, and reading a spec or a shape
imports no torch."""

from __future__ import annotations

import fnmatch
import subprocess
import sys

import pytest
import torch

from genbatch.models import families, family, presets, resolve_model
from genbatch.models.base import CROSS
from genbatch.models.registry import FAMILY_MODULES, module_blocks
from genbatch.models.vae_rules import KINDS
from genbatch.runner.presets import build_preset
from tests.support.runs import REPO

ORIGINAL = ("tiny-wan", "tiny-flux", "tiny-sd3")


@pytest.fixture(scope="module")
def built():
    return {name: build_preset(name) for name in ORIGINAL}


@pytest.mark.parametrize("preset", ORIGINAL)
def test_blocks_and_attention_name_real_modules(built, preset):
    pipe = built[preset]
    model_family = family(resolve_model(preset).family)
    plan = model_family.transformer_parts(type(pipe.transformer).__name__)
    children = dict(pipe.transformer.named_children())
    for name in (*plan.blocks.before, *plan.blocks.after):
        assert name in children, name
    named = [name for name, _ in pipe.transformer.named_modules()]
    covered = set()
    for site in plan.attention:
        matches = [name for name in named if fnmatch.fnmatchcase(name, site.pattern)]
        assert matches or site.pattern.endswith("attn2"), site.pattern  # SD3.5's attn2 is absent from SD3
        assert (site.kind == CROSS) == (not site.streams)
        covered.update(matches)
    # every repeated block is a ModuleList, and each block's attention modules are all listed
    for path in plan.blocks.repeated:
        blocks = pipe.transformer.get_submodule(path)
        assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0
    listed = {type(module).__name__ for name, module in pipe.transformer.named_modules() if name in covered}
    for name, module in pipe.transformer.named_modules():
        if type(module).__name__ in listed:
            assert name in covered, f"{name} is an attention module the family does not list"
    # the text encoders' blocks
    for component in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        encoder = getattr(pipe, component, None)
        if encoder is not None:
            blocks = module_blocks(type(encoder).__name__)
            assert blocks is not None, type(encoder).__name__
            assert all(isinstance(encoder.get_submodule(path), torch.nn.ModuleList) for path in blocks.repeated)


def test_the_sequence_plans_are_the_families_and_name_real_modules(built):
    from genbatch.parallel.routing import SEQUENCE_ROUTING, sequence_routing

    planned = {name for model_family in families().values()
               for name, plan in model_family.transformers.items() if plan.sequence is not None}
    assert set(SEQUENCE_ROUTING) == planned
    for preset in ORIGINAL:
        transformer = built[preset].transformer
        plan, cp_plan = sequence_routing(transformer)
        names = [name for name, _ in transformer.named_modules()]
        for module in cp_plan:
            assert any(fnmatch.fnmatchcase(name, module) for name in names), (preset, module)
        assert plan.attention_modules(transformer), preset  # (SD3.5's attn2 pattern matches nothing in SD3)


def test_fsdp_shards_the_blocks_the_family_lists(built):
    from genbatch.parallel.fsdp import block_paths

    pipe = built["tiny-flux"]
    assert block_paths(pipe.transformer) == ("transformer_blocks", "single_transformer_blocks")
    assert block_paths(pipe.text_encoder) == ("encoder.layers",)  # CLIPTextModel (transformers 5)
    assert block_paths(pipe.text_encoder_2) == ("encoder.block",)
    assert "blocks" in block_paths(torch.nn.Linear(1, 1))  # a class no family lists: every known path


def test_vae_rules_are_known_kinds_and_cover_the_tiny_decoders(built):
    from genbatch.parallel.vae.forwards import unsupported_reason

    for model_family in families().values():
        assert set(model_family.vae_rules.values()) <= set(KINDS), model_family.name
    for preset in ORIGINAL:
        assert unsupported_reason(built[preset].vae) is None, preset


def test_every_family_is_listed_once_and_claims_its_presets():
    assert len(families()) == len(FAMILY_MODULES)
    for name, (model_family, preset) in presets().items():
        spec = resolve_model(name)
        assert spec.family == model_family.name and spec.defaults == dict(preset.defaults)
    with pytest.raises(ValueError, match="genbatch runs"):
        family("no-such-family")


def test_specs_shapes_and_the_order_import_no_torch():
    """`gen validate` and `gen plan` read every family's specs and shapes without loading torch."""
    code = (
        "import sys\n"
        "from genbatch.models import families, preset_names, resolve_model\n"
        "from genbatch.planner.shapes import PUBLISHED, resolve_shape\n"
        "from genbatch.jobs.schedule import hand_out_order\n"
        "for name in preset_names(): resolve_shape(resolve_model(name))\n"
        "assert all(f.hooks and f.transformers for f in families().values())\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
