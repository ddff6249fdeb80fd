"""Models named by hub id: resolved offline from a cache laid out as huggingface_hub lays it out, an existing
directory of that name winning, a miss naming the cache and the fill command, a published model's name read as its
hub id, `gen run` of both, and one downloader per node with the other ranks waiting past a short collective
timeout."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

from tests.support.hub import add_snapshot
from tests.support.runs import run_cli as gen
from tests.support.runs import write_manifest

MAIN = "0123456789abcdef0123456789abcdef01234567"
V2 = "89abcdef0123456789abcdef0123456789abcdef"
WAN = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
"""The published model wan2.1-1.3b's hub id (the fixture's cache holds tiny-wan's files under it)."""


@pytest.fixture(scope="module")
def tiny_wan_dir(tmp_path_factory) -> str:
    from genbatch.runner.presets import build_preset

    path = tmp_path_factory.mktemp("saved") / "tiny-wan"
    build_preset("tiny-wan").save_pretrained(path)
    return str(path)


@pytest.fixture
def hub_cache(tmp_path, tiny_wan_dir, monkeypatch):
    """HF_HUB_CACHE with org/tiny-wan at MAIN (refs/main) and at V2 (refs/v2), and tiny-wan as `WAN` at MAIN."""
    from genbatch.models import resolve_model

    cache = str(tmp_path / "hub")
    add_snapshot(cache, "org/tiny-wan", tiny_wan_dir, MAIN)
    add_snapshot(cache, "org/tiny-wan", tiny_wan_dir, V2, refs=("v2",))
    add_snapshot(cache, WAN, tiny_wan_dir, MAIN)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()  # specs are cached by name; each test has its own cache
    yield cache
    resolve_model.cache_clear()


def test_a_hub_id_resolves_offline_from_the_cache(hub_cache):
    from genbatch.models import resolve_model

    spec = resolve_model("org/tiny-wan")
    assert spec.name == "org/tiny-wan" and spec.family == "wan" and spec.is_video
    assert spec.path == os.path.join(hub_cache, "models--org--tiny-wan", "snapshots", MAIN)
    assert resolve_model("org/tiny-wan").path == spec.path  # resolved once per name


def test_a_published_name_is_read_from_its_hub_id_in_the_cache(hub_cache):
    from genbatch.models import resolve_model, resolve_model_or_published

    spec = resolve_model("wan2.1-1.3b")
    snapshot = os.path.join(hub_cache, "models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers", "snapshots", MAIN)
    assert spec.name == "wan2.1-1.3b" and spec.path == snapshot
    assert resolve_model_or_published("wan2.1-1.3b") == spec  # the cached model's own configs, not the published
    assert spec.num_heads == resolve_model("tiny-wan").num_heads != 12


@pytest.mark.parametrize("revision", ["v2", V2])
def test_a_revision_picks_its_snapshot(hub_cache, revision):
    from genbatch.models import resolve_model

    spec = resolve_model(f"org/tiny-wan@{revision}")
    assert spec.path == os.path.join(hub_cache, "models--org--tiny-wan", "snapshots", V2)
    assert spec.name == f"org/tiny-wan@{revision}"


def test_an_existing_directory_of_that_name_wins(hub_cache, tiny_wan_dir, tmp_path, monkeypatch):
    import shutil

    from genbatch.models import resolve_model

    shutil.copytree(tiny_wan_dir, tmp_path / "work" / "org" / "tiny-wan")
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_model("org/tiny-wan").path == "org/tiny-wan"


@pytest.mark.parametrize(("name", "command"), [("org/absent", "hf download org/absent"),
                                               ("org/tiny-wan@v9", "hf download org/tiny-wan --revision v9")])
def test_a_miss_names_the_cache_and_the_command_that_fills_it(hub_cache, name, command):
    from genbatch.models import UnknownModelError, resolve_model

    with pytest.raises(UnknownModelError) as error:
        resolve_model(name)
    assert hub_cache in str(error.value) and f"`{command}`" in str(error.value)
    assert "--download" in str(error.value)


def test_a_manifest_model_column_of_hub_ids(hub_cache, tmp_path):
    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests import read_jobs

    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "a", "prompt": "p", "model": "org/tiny-wan"},
        {"id": "b", "prompt": "p", "model": "org/tiny-wan@v2"},
        {"id": "c", "prompt": "p", "model": "org/absent"},
    ])
    loaded = read_jobs(manifest, overrides=JobOverrides(model="org/tiny-wan"))
    assert sorted(job.id for job in loaded.jobs) == ["a", "b"]
    (rejection,) = loaded.rejected
    assert rejection.column == "model" and "hf download org/absent" in rejection.reason


def test_gen_validate_takes_hub_ids(hub_cache, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "p", "model": "org/tiny-wan@v2"},
                                                            {"id": "b", "prompt": "p"}])
    result = gen("validate", manifest, "--model", "org/tiny-wan")
    assert result.returncode == 0, result.stdout + result.stderr


def test_gen_run_of_a_hub_id_or_a_published_name_makes_outputs(hub_cache, tmp_path):
    from genbatch.io import decode_mp4

    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "main", "prompt": "a fox", "num_inference_steps": 2},
        {"id": "v2", "prompt": "an owl", "model": "org/tiny-wan@v2", "num_inference_steps": 2},
        {"id": "published", "prompt": "a cat", "model": "wan2.1-1.3b", "num_inference_steps": 2},
    ])
    result = gen("run", manifest, "--out", str(tmp_path / "out"), "--model", "org/tiny-wan", "--no-download",
                 "--width", "64", "--height", "48", "--frames", "9")  # a saved directory has the family's defaults
    assert result.returncode == 0, result.stderr
    for job in ("main", "v2", "published"):
        assert decode_mp4((tmp_path / "out" / "outputs" / f"{job}.mp4").read_bytes()).shape == (9, 48, 64, 3)


def test_without_download_a_miss_is_named_and_nothing_is_fetched(hub_cache):
    from genbatch.models.hub import download_allowed, parse_hub_id
    from genbatch.runner.download import ModelFetch

    calls = []
    fetcher = ModelFetch(allowed=download_allowed(None), fetch=calls.append, quiet=True)  # HF_HUB_OFFLINE=1
    failures = fetcher.fill_cache([parse_hub_id("org/absent"), parse_hub_id("org/tiny-wan")])
    assert calls == [] and list(failures) == ["org/absent"] and "hf download org/absent" in failures["org/absent"]


def test_a_stop_signal_ends_a_wait():
    import torch.distributed as dist

    from genbatch.runner.download import DownloadStopped, ModelFetch

    fetcher = ModelFetch(allowed=True, stopped=lambda: True, quiet=True)
    with pytest.raises(DownloadStopped):
        fetcher.run(names=list, store=dist.HashStore(), key="k", rank=1, local_rank=1, world_size=2)


FETCH_SECONDS = 5.0
"""How long the stand-in download takes: twice the collective timeout of the ranks that wait for it."""


def _fetch_per_node(rank: int, world_size: int, base: str, source: str) -> dict:
    """Ranks 0, 1 on node 0 and rank 2 on node 1, each node with its own cache; the stand-in fetch records
    who called it and fills the cache after FETCH_SECONDS."""
    import torch.distributed as dist

    from genbatch.models.hub import cached_snapshot, parse_hub_id
    from genbatch.runner.download import ModelFetch

    node, local_rank = (0, rank) if rank < 2 else (1, rank - 2)
    cache = os.path.join(base, f"node{node}")
    os.environ["HF_HUB_CACHE"] = cache
    short = dist.new_group(backend="gloo", timeout=timedelta(seconds=FETCH_SECONDS / 2))

    def fetch(hub):
        with open(os.path.join(base, f"fetched-by-rank{rank}"), "w", encoding="utf-8") as handle:
            handle.write(hub.name)
        time.sleep(FETCH_SECONDS)
        add_snapshot(cache, hub.repo, source, MAIN)

    started = time.monotonic()
    failures = ModelFetch(allowed=True, fetch=fetch, quiet=True).run(
        names=lambda: ["tiny-wan", "org/tiny-wan", "org/tiny-wan"], store=dist.distributed_c10d._get_default_store(),
        key="test/hub", rank=rank, local_rank=local_rank, world_size=world_size,
    )
    waited = time.monotonic() - started
    dist.barrier(group=short)  # the group is whole after waiting twice its timeout
    path = cached_snapshot(parse_hub_id("org/tiny-wan"))
    return {"failures": failures, "path": path, "waited": waited}


def test_one_rank_per_node_downloads_and_the_others_wait_past_the_collective_timeout(tmp_path, tiny_wan_dir):
    from tests.support.distributed import run_on_ranks

    results = run_on_ranks(_fetch_per_node, 3, args=(str(tmp_path), tiny_wan_dir), timeout_s=30)
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("fetched-by")) == [
        "fetched-by-rank0", "fetched-by-rank2"]  # LOCAL_RANK 0 of each node, once for the one hub id
    assert all(result["failures"] == {} for result in results)
    for rank, result in enumerate(results):
        node = 0 if rank < 2 else 1
        assert result["path"] == os.path.join(tmp_path, f"node{node}", "models--org--tiny-wan", "snapshots", MAIN)
        assert result["waited"] >= FETCH_SECONDS  # rank 1 waited for its node's download, twice its timeout
