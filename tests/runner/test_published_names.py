"""A published model's name (`wan2.1-1.3b`, `gen models`) stands for its hub id: `gen validate` takes every name
`gen models` lists as runnable (a published one not in the Hugging Face cache checked against its published
configs), `gen run` downloads its hub id, and stops naming the fill command when it may not; a near miss of a name
is answered with the name. One in the cache, read and run from there: tests/runner/test_hub_models.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.runs import run_cli, write_manifest

ROOT = Path(__file__).resolve().parents[2]
WAN = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # wan2.1-1.3b's hub id


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """An empty HF_HUB_CACHE, offline; specs resolved afresh."""
    from genbatch.models import resolve_model

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    yield str(cache)
    resolve_model.cache_clear()


def _runnable() -> list[tuple[str, str]]:
    from genbatch.planner.catalog import catalog

    return [(item.name, item.kind) for item in catalog() if item.kind != "plan only"]


def test_gen_validate_takes_every_runnable_name_gen_models_lists(empty_hub, tmp_path):
    import json

    from genbatch.models import resolve_model_or_published

    shutil.copy(ROOT / "examples" / "images" / "lighthouse.png", tmp_path / "in.png")
    rows = []
    for name, _ in _runnable():
        spec = resolve_model_or_published(name)
        assert spec.name == name and (spec.path is None), name  # a published one: from its configs, uncached
        rows.append({"id": name, "prompt": "p", "model": name,
                     **{column: "in.png" for column in ("image", "last_image") if column in spec.media_required}})
    result = run_cli("validate", write_manifest(str(tmp_path / "m.parquet"), rows), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["by_model"] == {name: {"valid": 1, "rejected": 0} for name, _ in _runnable()}
    kinds = [kind for _, kind in _runnable()]
    assert kinds.count("published") >= 20 and kinds.count("preset") >= 20


def test_gen_run_downloads_a_published_name_by_its_hub_id(empty_hub):
    from genbatch.models.hub import HubId
    from genbatch.runner.download import ModelFetch

    fetched = []
    fetcher = ModelFetch(allowed=True, fetch=fetched.append, quiet=True)
    failures = fetcher.run(names=lambda: ["wan2.1-1.3b", "tiny-wan", "FLUX.1-dev", "org/other", None], store=None,
                           key="k", rank=0, local_rank=0, world_size=1)
    assert failures == {}
    assert fetched == [HubId(repo=WAN), HubId(repo="black-forest-labs/FLUX.1-dev"), HubId(repo="org/other")]


def test_without_the_cache_or_a_download_gen_run_stops_naming_the_fill_command(empty_hub):
    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests.preflight import RunOptionError, check_options
    from genbatch.models import resolve_model_or_published

    with pytest.raises(RunOptionError) as error:
        check_options(JobOverrides(model="flux.1-dev"))  # what gen run checks once the downloads are done
    message = str(error.value)
    assert "published model 'flux.1-dev', hub model black-forest-labs/FLUX.1-dev" in message
    assert "`hf download black-forest-labs/FLUX.1-dev`" in message and empty_hub in message
    check_options(JobOverrides(model="flux.1-dev"), resolve_model_or_published)  # what gen validate checks


def test_a_near_miss_is_answered_with_the_published_name(empty_hub):
    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests.preflight import RunOptionError, check_options

    with pytest.raises(RunOptionError, match="did you mean 'flux.1-dev'"):
        check_options(JobOverrides(model="flux.1-devv"))
    assert not os.path.exists("flux.1-devv")
