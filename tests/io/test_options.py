from __future__ import annotations

import pytest

from genbatch.io import RunStore, parse_storage_options
from genbatch.io.options import open_filesystem


def test_values_are_converted():
    parsed = parse_storage_options([
        "anon=false", "use_ssl=True", "max_concurrency=4", "timeout=2.5", "profile=none",
        "endpoint_url=http://127.0.0.1:9000", "client_kwargs.region_name=eu-west-1",
        "client_kwargs.verify=false", 'config_kwargs={"s3": {"addressing_style": "path"}}', "token=a=b",
    ])
    assert parsed == {
        "anon": False, "use_ssl": True, "max_concurrency": 4, "timeout": 2.5, "profile": None,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1", "verify": False},
        "config_kwargs": {"s3": {"addressing_style": "path"}}, "token": "a=b",
    }
    assert parse_storage_options([]) == {}


@pytest.mark.parametrize("bad, message", [
    ("novalue", "not key=value"), ("=x", "not key=value"), ("a..b=1", "empty part"), ("k={oops", "JSON"),
])
def test_bad_items_name_the_fix(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_storage_options([bad])


def test_nesting_under_a_value_is_refused():
    with pytest.raises(ValueError, match="already has a value"):
        parse_storage_options(["a=1", "a.b=2"])


def test_urls_are_normalized(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RunStore("runs/x/").url == str(tmp_path / "runs/x")
    assert RunStore(f"file://{tmp_path}/y").url == str(tmp_path / "y")
    assert RunStore("memory://bucket/run/").url == "memory:///bucket/run"
    fs, root, url = open_filesystem("s3://bucket/run/", {"anon": True})
    assert (root, url) == ("bucket/run", "s3://bucket/run")
    assert fs.retries == 1 and fs.config_kwargs["retries"]["total_max_attempts"] == 1
    with pytest.raises(ValueError, match="names no bucket"):
        open_filesystem("s3://", {"anon": True})
    with pytest.raises(ValueError, match="empty"):
        RunStore("")


def test_user_retry_config_wins():
    fs, _, _ = open_filesystem("s3://b/r", {"anon": True, "config_kwargs": {"retries": {"max_attempts": 3}}})
    assert fs.config_kwargs["retries"]["max_attempts"] == 3 and "total_max_attempts" not in fs.config_kwargs["retries"]
