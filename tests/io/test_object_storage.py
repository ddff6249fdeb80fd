"""Object-storage behaviour against real servers: faults injected by a proxy, permanent errors, multipart
hygiene, configuration from the environment. Runs on moto_server, and on Ceph RGW when configured."""

from __future__ import annotations

import hashlib
import time

import pytest

from genbatch.io import BackgroundWriter, RetryPolicy, RunStore, StorageError
from tests.support.faulty_proxy import FaultyProxy
from tests.support.s3 import MotoServer

FAST_RETRY = RetryPolicy(attempts=12, base_delay_s=0.005, max_delay_s=0.1)


def _media(job_id: str, size: int = 2000) -> bytes:
    seed = hashlib.sha256(job_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def test_commits_under_faults_lose_and_duplicate_nothing(s3_run):
    """A third of all requests fail (503, reset before, reset after the server applied them)."""
    ids = [f"job-{i:02d}" for i in range(24)]
    with FaultyProxy(s3_run.endpoint.endpoint_url, fault_rate=0.33, seed=5) as proxy:
        options = s3_run.endpoint.storage_options(proxy.endpoint_url)
        store = RunStore(s3_run.url, options, retry=FAST_RETRY)
        with BackgroundWriter(max_pending=4) as writer:
            futures = [writer.submit(store.commit, i, _media(i), "mp4", {"seed": n}) for n, i in enumerate(ids)]
            for n in range(3):
                store.append_timings([dict(run_id="r", job_id=ids[n], rank=0, stage="write", start=1.0, seconds=n)])
                writer.submit(store.flush_timings)
            writer.submit(store.record_failure, "bad", {"error": "boom"})
            writer.submit(store.save_checkpoint, "ckpt", b"latents" * 100)
        first = [f.result() for f in futures]
        again = [store.commit(i, b"other bytes", "mp4", {"seed": -1}) for i in ids]
        faults = proxy.counts
        lost_marker_answers = [p for m, p, o in proxy.log if m == "PUT" and "/done/" in p and o == "drop_after"]
    assert all(not r.already_done for r in first), "a retried commit was taken for an earlier one"
    assert all(r.already_done for r in again)
    assert faults["503"] and faults["drop_before"] and faults["drop_after"], faults
    assert lost_marker_answers, "no marker PUT landed with its answer lost: raise the job count"

    clean = RunStore(s3_run.url, s3_run.storage_options)  # straight to the server, no proxy
    assert clean.done_ids() == set(ids)
    outputs = clean.objects.list_names(clean.layout.join("outputs"))
    assert outputs == sorted(f"{i}.mp4" for i in ids)
    for n, job_id in enumerate(ids):
        assert clean.fs.cat_file(clean.layout.output(job_id, "mp4")) == _media(job_id)
        record = clean.read_done(job_id)
        assert record["seed"] == n and record["output_sha256"] == hashlib.sha256(_media(job_id)).hexdigest()
    assert clean.read_timings().num_rows == 3
    assert clean.failed_ids() == {"bad"}
    assert clean.load_checkpoint("ckpt") == b"latents" * 100
    assert clean.fs.list_multipart_uploads(s3_run.bucket) == []


def test_write_that_keeps_failing_leaves_job_not_done(s3_run):
    """Every PUT of an output 503s: the commit fails after the policy's tries and no marker appears."""
    def outputs_only(method, path):
        return method == "PUT" and "/outputs/" in path

    with FaultyProxy(s3_run.endpoint.endpoint_url, fault_rate=1.0, kinds=("503",), applies=outputs_only) as proxy:
        store = RunStore(s3_run.url, s3_run.endpoint.storage_options(proxy.endpoint_url),
                         retry=RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.01))
        with pytest.raises(StorageError, match="after 3 tries") as caught:
            store.commit("j", b"media", "png", {})
        puts = [p for m, p, _ in proxy.log if m == "PUT"]
    assert caught.value.transient and len(puts) == 3
    assert store.done_ids() == set()


def test_permanent_error_fails_at_once_naming_url_and_fix(s3_run):
    with FaultyProxy(s3_run.endpoint.endpoint_url) as proxy:
        url = f"s3://{s3_run.bucket}-missing/run"
        store = RunStore(url, s3_run.endpoint.storage_options(proxy.endpoint_url), retry=RetryPolicy(attempts=5))
        started = time.monotonic()
        with pytest.raises(StorageError) as caught:
            store.commit("j", b"media", "png", {})
        puts = [p for m, p, _ in proxy.log if m == "PUT"]
    assert len(puts) == 1, "a permanent error must not be retried"
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"{url}/outputs/j.png" in message and "bucket exists" in message
    assert not caught.value.transient


def test_media_is_one_put_and_small_files_never_go_multipart(s3_run):
    big = _media("big", 12 * 2**20)  # above the 5 MiB where s3fs's file writer would start a multipart upload
    with FaultyProxy(s3_run.endpoint.endpoint_url) as proxy:
        store = RunStore(s3_run.url, s3_run.endpoint.storage_options(proxy.endpoint_url))
        store.commit("big", big, "mp4", {})
        store.save_checkpoint("big", big)
        log = list(proxy.log)
    assert [m for m, _, _ in log] == ["GET", "PUT", "PUT", "PUT"]  # marker check, media, marker, checkpoint
    assert not any("uploads" in path or "partNumber" in path for _, path, _ in log)
    assert store.fs.cat_file(store.layout.output("big", "mp4")) == big


def test_abort_stale_uploads_under_the_run_prefix(s3_run):
    fs = s3_run.endpoint.filesystem()
    for key in ("run/outputs/killed.mp4", "run/checkpoints/killed.ckpt", "elsewhere/keep.bin"):
        fs.call_s3("create_multipart_upload", Bucket=s3_run.bucket, Key=key)
    store = RunStore(s3_run.url, s3_run.storage_options)
    assert store.abort_stale_uploads() == 2
    left = fs.list_multipart_uploads(s3_run.bucket)
    assert [u["Key"] for u in left] == ["elsewhere/keep.bin"]
    assert store.abort_stale_uploads() == 0


def test_endpoint_and_credentials_from_environment(s3_run, monkeypatch):
    for key, value in s3_run.env.items():
        monkeypatch.setenv(key, value)
    store = RunStore(s3_run.url)  # no storage options: s3fs reads AWS_ENDPOINT_URL and the keys
    store.commit("env", b"from env", "png", {})
    assert RunStore(s3_run.url, s3_run.storage_options).done_ids() == {"env"}


@pytest.fixture(scope="module")
def moto_with_auth():
    """A moto_server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0): unknown keys get 403."""
    with MotoServer(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server.endpoint


def test_bad_credentials_fail_at_once_naming_the_fix(moto_with_auth):
    with FaultyProxy(moto_with_auth.endpoint_url) as proxy:
        options = {**moto_with_auth.storage_options(proxy.endpoint_url), "key": "AKIANOTAREALKEY00000",
                   "secret": "wrong"}
        store = RunStore("s3://anybucket/run", options, retry=RetryPolicy(attempts=5))
        with pytest.raises(StorageError, match="credentials") as caught:
            store.save_checkpoint("j", b"x")
        assert len(proxy.log) == 1, "a 403 must not be retried"
    assert not caught.value.transient and "s3://anybucket/run/checkpoints/j.ckpt" in str(caught.value)
    assert isinstance(caught.value.__cause__, PermissionError)
