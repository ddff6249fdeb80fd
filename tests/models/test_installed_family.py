"""A model family from an installed package registers through the entry-point group `genbatch.families`: a tiny
dist-info on the path, whose family is a renamed copy of tiny-flux, runs end to end under `gen run` with nothing
in genbatch changed, and makes what tiny-flux makes; an entry point that does not load, or names no family, is
named with the fix."""

from __future__ import annotations

import importlib.metadata
import os

import pyarrow.parquet as pq
import pytest

from genbatch.models import registry
from tests.support.runs import REPO, gen, write_manifest

FAMILY_MODULE = '''"""A family kept outside genbatch: tiny-flux under another name."""
from dataclasses import replace

from genbatch.models import flux


def read_spec(name, transformer, vae, defaults, path):
    return replace(flux.read_spec(name, transformer, vae, defaults, path), family="outside-flux")


(_PRESET,) = flux.FAMILY.presets
FAMILY = replace(flux.FAMILY, name="outside-flux", pipelines=("OutsideFluxPipeline",), read_spec=read_spec,
                 presets=(replace(_PRESET, name="tiny-outside-flux"),), published=(), teacache=())
'''


def _install(site) -> None:
    """A package and its dist-info, as pip would leave them in site-packages."""
    package = site / "outside_family"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAMILY_MODULE)
    info = site / "outside_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[genbatch.families]\noutside-flux = outside_family:FAMILY\n")


@pytest.mark.processes  # a fresh interpreter finds the installed package, as a user's would
def test_an_installed_family_runs_end_to_end_and_makes_what_its_original_makes(tmp_path):
    site = tmp_path / "site"
    _install(site)
    row = {"prompt": "a lighthouse at dusk", "seed": 4, "num_inference_steps": 2, "width": 64, "height": 64}
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "built-in", "model": "tiny-flux", **row},
                                                            {"id": "installed", "model": "tiny-outside-flux", **row}])
    out = tmp_path / "out"
    result = gen("run", manifest, "--out", str(out), "-q", env={"PYTHONPATH": os.pathsep.join([REPO, str(site)])})
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = out / "outputs"
    assert (outputs / "installed.png").read_bytes() == (outputs / "built-in.png").read_bytes()
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert results["installed"]["model"] == "tiny-outside-flux" and results["installed"]["status"] == "done"
    assert (out / "done" / "installed.json").exists()


def _entry_points_with(monkeypatch, *entries):
    found = importlib.metadata.entry_points

    def entry_points(**selection):
        if selection.get("group") == registry.ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints(entries)
        return found(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.mark.parametrize(("value", "message"), [
    ("no_such_package.family:FAMILY", r"entry point broken = no_such_package.family:FAMILY does not load "
                                      r"\(ModuleNotFoundError.*fix or uninstall that package"),
    ("genbatch.models.flux:read_spec", r"is a function, not a genbatch.models.base.ModelFamily; point it at the "
                                       r"family record"),
    ("genbatch.models.flux:FAMILY", r"the entry point broken = genbatch.models.flux:FAMILY and the module "
                                    r"genbatch.models.flux both name the family 'flux'; rename one"),
])
def test_a_broken_entry_point_is_named_with_the_fix(monkeypatch, value, message):
    _entry_points_with(monkeypatch, importlib.metadata.EntryPoint(name="broken", value=value,
                                                                  group=registry.ENTRY_POINT_GROUP))
    registry.families.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            registry.families()
    finally:
        monkeypatch.undo()
        registry.families.cache_clear()
    assert "outside-flux" not in registry.families() and "flux" in registry.families()
