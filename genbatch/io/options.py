"""Storage options: the `--storage-option key=value` parser and the filesystem a run URL opens.

    parse_storage_options(["anon=false", "client_kwargs.region_name=eu-west-1"])
        -> {"anon": False, "client_kwargs": {"region_name": "eu-west-1"}}

Credentials and endpoints also come from the environment as s3fs reads it (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, FSSPEC_S3_ENDPOINT_URL, ...); options given here win over the environment.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

# s3fs and botocore retry inside each call; the store retries whole operations itself (retry.py), so the
# inner layers are turned off unless the user asks for them: one policy decides how long a write may take.
# botocore's socket timeouts (60 s each by default) are lowered to the store's bound (--storage-timeout).
_S3_DEFAULTS: dict[str, Any] = {
    "use_listings_cache": False,  # other ranks write markers: every listing must ask the server
    "skip_instance_cache": True,  # the endpoint may come from env vars, which fsspec's cache key ignores
}
_S3_CONFIG_DEFAULTS: dict[str, Any] = {"retries": {"total_max_attempts": 1}}
_BOTOCORE_TIMEOUT_S = 60.0  # botocore's own connect_timeout and read_timeout


def _convert(text: str) -> Any:
    """Turn an option's text into the value a filesystem expects: bools, None, numbers, JSON, else text."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"storage option value {text!r} looks like JSON but is not: {exc}") from exc
    return text


def parse_storage_options(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse `key=value` strings into fsspec storage options.

    Values `true`/`false` become bools, `none`/`null` None, integers and floats numbers, `[...]`/`{...}`
    JSON; dotted keys nest (`client_kwargs.endpoint_url=http://...`). Raises ValueError naming a bad item.
    """
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(
                f"storage option {item!r} is not key=value: write it as e.g. "
                "--storage-option endpoint_url=http://127.0.0.1:9000"
            )
        parts = key.split(".")
        if any(not part for part in parts):
            raise ValueError(f"storage option key {key!r} has an empty part: write a.b=value, not a..b=value")
        target = options
        for part in parts[:-1]:
            node = target.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"storage option {item!r} nests under {part!r}, which already has a value")
            target = node
        target[parts[-1]] = _convert(value)
    return options


def _with_s3_defaults(options: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
    merged = {**copy.deepcopy(_S3_DEFAULTS), **options}
    config = dict(merged.get("config_kwargs") or {})
    for key, value in _S3_CONFIG_DEFAULTS.items():
        config.setdefault(key, copy.deepcopy(value))  # botocore edits this dict: never hand it ours
    socket_timeout = _BOTOCORE_TIMEOUT_S if timeout_s is None else min(_BOTOCORE_TIMEOUT_S, timeout_s)
    config.setdefault("connect_timeout", socket_timeout)
    config.setdefault("read_timeout", socket_timeout)
    merged["config_kwargs"] = config
    return merged


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None, timeout_s: float | None = None):
    """Return (fs, root path inside fs, normalized URL) for a run URL: a local path or any fsspec URL.

    `timeout_s`: the store's bound on one operation (--storage-timeout); botocore's socket timeouts stay
    within it."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"run URL {url!r} is empty: pass --out DIR or --out s3://bucket/prefix")
    options = dict(storage_options or {})
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in ("s3", "s3a"):
        options = _with_s3_defaults(options, timeout_s)
    fs, path = fsspec.core.url_to_fs(url, **options)
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs's own retry loop (a class attribute; this instance is ours: skip_instance_cache)
    path = path.rstrip("/") or path
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(path)
        return fs, path, path
    if protocol in ("s3", "s3a") and not path.strip("/"):
        raise ValueError(f"run URL {url!r} names no bucket: use s3://bucket/prefix")
    return fs, path, fs.unstrip_protocol(path)
