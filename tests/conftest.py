"""Fixtures shared by every test folder.

    moto_endpoint (session)  a moto_server subprocess on loopback (started on first use, stopped at the end)
    s3_server     (session)  a real S3 API: moto always; also Ceph RGW when GENBATCH_TEST_CEPH_ENDPOINT is
                             set (those instances carry the `ceph` mark). Tests using it run once per server.
    s3_run        (function) a fresh bucket on that server: .url ("s3://<bucket>/run"), .storage_options,
                             .env (for subprocesses), .endpoint
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.support.s3 import MotoServer, S3Endpoint, ceph_endpoint

S3_SERVERS = ["moto"] + ([pytest.param("ceph", marks=pytest.mark.ceph)] if ceph_endpoint() else [])


@pytest.fixture(scope="session")
def moto_endpoint():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a cloud metadata service in tests
        with MotoServer() as server:
            yield server.endpoint


def s3_endpoint_for(request, name: str) -> S3Endpoint:
    """The endpoint of server `name` ("moto" or "ceph") for a fixture that parametrizes over servers."""
    return request.getfixturevalue("moto_endpoint") if name == "moto" else ceph_endpoint()


@pytest.fixture(scope="session", params=S3_SERVERS)
def s3_server(request) -> S3Endpoint:
    return s3_endpoint_for(request, request.param)


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


def fresh_s3_run(endpoint: S3Endpoint):
    """Create a bucket on `endpoint`; yield its S3Run; delete the bucket after."""
    bucket = endpoint.create_bucket()
    yield S3Run(url=f"s3://{bucket}/run", bucket=bucket, storage_options=endpoint.storage_options(),
                env=endpoint.env(), endpoint=endpoint)
    endpoint.delete_bucket(bucket)


@pytest.fixture
def s3_run(s3_server: S3Endpoint):
    yield from fresh_s3_run(s3_server)


@pytest.fixture(scope="session", autouse=True)
def rank_pools():
    """The session's pools of gloo ranks (tests/support/pool.py), spawned on first use and closed at the end."""
    from tests.support.pool import close_pools

    yield
    close_pools()


def pytest_addoption(parser):
    parser.addoption("--reverse-order", action="store_true",
                     help="Run the collected tests last to first: a test that needs another to run before it fails.")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: a module weighs the tests this run selected
def pytest_collection_modifyitems(config, items):
    """`make test` and `make test-slow` run on two pytest-xdist workers with `--dist loadfile`: a module's tests
    on one worker, so its module fixtures are made once. A session fixture is made once per worker (each
    worker's Slurm cluster has its own ports, munge socket and state), or once per session where it shares its
    result through the session's temporary folder (gen bench's tiny report: tests/benchmark/conftest.py).

    The modules come heaviest first by their tests' recorded seconds (tests/support/module_seconds.py), which
    xdist hands out in that order under `--no-loadscope-reorder`: the light modules fill the end, where a heavy
    one drawn last would keep one worker busy and the other idle. `--reverse-order` then runs it all backwards."""
    from tests.support.module_seconds import heaviest_first

    items[:] = heaviest_first(items)
    if config.getoption("--reverse-order"):
        items.reverse()


def pytest_configure(config):
    """Under pytest-xdist each worker takes its share of the cores for torch's threads: two workers on 2 cores,
    each with torch's default of 2 threads, oversubscribe the cores, and their OpenMP threads spin against each
    other (the in-process model tests took twice as long: 67 tests in 91-102 s, 48-50 s with a thread each). The
    pool's ranks and `gen` subprocesses run one thread each already (tests/support)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
