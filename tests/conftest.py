"""Fixtures shared by every test folder.

    s3_server  (session)  a real S3 API: moto_server always; also Ceph RGW when GENBATCH_TEST_CEPH_ENDPOINT
                          is set (those instances carry the `ceph` mark). Tests using it run once per server.
    s3_run     (function) a fresh bucket on that server: .url ("s3://<bucket>/run"), .storage_options,
                          .env (for subprocesses), .endpoint
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.s3 import MotoServer, S3Endpoint, ceph_endpoint

_SERVERS = ["moto"] + ([pytest.param("ceph", marks=pytest.mark.ceph)] if ceph_endpoint() else [])


@pytest.fixture(scope="session", params=_SERVERS)
def s3_server(request):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a cloud metadata service in tests
        if request.param == "ceph":
            yield ceph_endpoint()
            return
        with MotoServer() as server:
            yield server.endpoint


@dataclass(kw_only=True, slots=True)
class S3Run:
    """A run URL in a fresh bucket of a real S3 server."""

    url: str
    """s3://<bucket>/run"""
    bucket: str
    """The bucket, created for this test and deleted after it."""
    storage_options: dict
    """Options for RunStore / fsspec (credentials and endpoint)."""
    env: dict
    """Environment variables for subprocesses (AWS_ENDPOINT_URL, credentials)."""
    endpoint: S3Endpoint
    """The server."""


@pytest.fixture
def s3_run(s3_server: S3Endpoint):
    bucket = s3_server.create_bucket()
    yield S3Run(url=f"s3://{bucket}/run", bucket=bucket, storage_options=s3_server.storage_options(),
                env=s3_server.env(), endpoint=s3_server)
    s3_server.delete_bucket(bucket)
