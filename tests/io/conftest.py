"""`run_target`: the same RunStore tests on a local folder, in memory, and on every available S3 server."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest

from tests.conftest import S3_SERVERS, fresh_s3_run, s3_endpoint_for


@dataclass(kw_only=True, slots=True)
class RunTarget:
    """Where a test's run lives."""

    kind: str
    """"local", "memory", "moto" or "ceph"."""
    url: str
    """The run URL to hand to RunStore."""
    storage_options: dict = field(default_factory=dict)
    """Options for RunStore."""


@pytest.fixture(params=["local", "memory", *S3_SERVERS])
def run_target(request, tmp_path):
    kind = request.param
    if kind == "local":
        yield RunTarget(kind=kind, url=str(tmp_path / "run"))
    elif kind == "memory":
        url = f"memory://gb-{uuid.uuid4().hex[:8]}/run"
        yield RunTarget(kind=kind, url=url)
        import fsspec

        try:
            fsspec.filesystem("memory").rm(url.split("://")[1].split("/")[0], recursive=True)
        except FileNotFoundError:  # nothing was left in it
            pass
    else:
        for run in fresh_s3_run(s3_endpoint_for(request, kind)):
            yield RunTarget(kind=kind, url=run.url, storage_options=run.storage_options)
