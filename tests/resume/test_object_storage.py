"""`gen run` on a real S3 server (moto_server on loopback): manifest and run both in the bucket, the endpoint
from the environment (a subprocess) or from `--storage-option` (in process); kill -9 mid-run, rerun; a run
through a proxy that answers 503 or drops the connection on a share of requests. Every time: each job done
exactly once, outputs equal to an uninterrupted local run, nothing left behind (no checkpoints, temp objects,
orphaned markers or open multipart uploads)."""

from __future__ import annotations

import signal

import pytest

from genbatch.io import RunStore
from tests.resume.common import encoded_by_attempt, leftovers, manifest_and_reference, outputs, wait_until
from tests.support.faulty_proxy import FaultyProxy
from tests.support.runs import gen, run_cli, start_gen

ROWS = [
    {"id": f"clip-{index}", "prompt": f"a paper boat on a pond, take {index}",
     "model": "tiny-wan" if index % 2 else "tiny-flux", "num_inference_steps": 10 + index}
    for index in range(6)
]
IDS = {row["id"] for row in ROWS}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return manifest_and_reference(tmp_path_factory, ROWS)


@pytest.fixture
def reference(uninterrupted):
    return uninterrupted[1]


@pytest.fixture
def s3_manifest(s3_run, uninterrupted) -> str:
    url = f"s3://{s3_run.bucket}/manifests/m.parquet"
    s3_run.endpoint.filesystem().put_file(uninterrupted[0], url)
    return url


def _check_finished(s3_run, reference) -> RunStore:
    store = RunStore(s3_run.url, s3_run.storage_options)
    assert store.done_ids() == IDS
    assert outputs(store) == reference
    assert leftovers(store, IDS) == []
    assert s3_run.endpoint.filesystem().list_multipart_uploads(s3_run.bucket) == []
    results = store.read_results().to_pylist()
    assert sorted(row["id"] for row in results) == sorted(IDS) and {row["status"] for row in results} == {"done"}
    return store


@pytest.mark.slow  # make test-slow runs it on moto, .ci/ceph.sh on Ceph; test_kill_resume covers kill -9 in make test
def test_kill_9_then_rerun_against_s3(s3_run, s3_manifest, reference):
    """Endpoint and credentials from the environment only, as on a cluster."""
    command = ("run", s3_manifest, "--out", s3_run.url, "-q", "--checkpoint-every", "3")
    store = RunStore(s3_run.url, s3_run.storage_options)
    process = start_gen(*command, env=s3_run.env)
    wait_until(lambda: len(store.done_ids()) >= 2, process, what="the first attempt")
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before = store.done_ids()
    assert 2 <= len(done_before) < len(ROWS), done_before

    resumed = gen(*command, env=s3_run.env)
    assert resumed.returncode == 0, resumed.stderr
    store = _check_finished(s3_run, reference)
    by_attempt = encoded_by_attempt(store)  # a killed attempt leaves no timings: only the rerun's are there
    assert list(by_attempt.values()) == [IDS - done_before]  # nothing done before the kill was redone


def test_faults_on_the_wire_lose_and_repeat_nothing(s3_run, s3_manifest, reference):
    """15% of all requests (manifest reads included) answer 503, or reset the connection before or after
    the server acted; the endpoint and credentials come from --storage-option only."""
    with FaultyProxy(s3_run.endpoint.endpoint_url, fault_rate=0.15, seed=3) as proxy:
        options = [f"--storage-option={key}={value}" for key, value in (
            ("endpoint_url", proxy.endpoint_url), ("key", s3_run.endpoint.key),
            ("secret", s3_run.endpoint.secret), ("client_kwargs.region_name", s3_run.endpoint.region))]
        result = run_cli("run", s3_manifest, "--out", s3_run.url, "-q", "--checkpoint-every", "2", *options)
        faults = proxy.counts
    assert result.returncode == 0, result.stderr
    assert faults["503"] and faults["drop_before"] and faults["drop_after"], faults
    store = _check_finished(s3_run, reference)
    assert encoded_by_attempt(store) and all(ids == IDS for ids in encoded_by_attempt(store).values())
    assert store.failed_ids() == set()
