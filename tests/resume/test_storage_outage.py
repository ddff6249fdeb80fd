"""Storage that goes away mid-run: `gen run --nproc 2` writing to a real S3 server (moto_server) that is stopped
(SIGSTOP: it keeps its state, and every request hangs) once a job is done. The run ends within a bound set by
--storage-timeout (not botocore's 60 s socket timeouts, nor five s3fs retries of them) with exit 75; what was
done stays done, and no job has a failure counted against --max-attempts. Once the server runs again
(SIGCONT), the same command finishes the rest. Storage that refuses for good (no such bucket, access denied)
exits 2 at once, on every rank.

The run must not finish before the server stops: it writes through a proxy that holds the long job's
checkpoint upload, so the long job cannot be committed (held, then timed out or sent to the stopped server),
a state the run cannot skip past; the server is stopped once that upload is held and a short job is done."""

from __future__ import annotations

import hashlib
import os
import signal
import time

import pytest

from genbatch.io import RunStore
from genbatch.jobs import exit_codes
from tests.resume.common import encoded_by_attempt, wait_until
from tests.support.distributed import free_port
from tests.support.faulty_proxy import FaultyProxy
from tests.support.runs import gen, run_cli, start_gen, write_manifest
from tests.support.s3 import MotoServer

TIMEOUT_S = 3  # --storage-timeout of the runs under test
ROWS = [  # hand-out is longest first: one rank takes the long job while the other commits the short ones
    {"id": "long", "prompt": "a fox running through snow", "model": "tiny-wan", "num_inference_steps": 60},
    *({"id": f"short-{n}", "prompt": f"a lighthouse at dusk, take {n}", "model": "tiny-flux",
       "num_inference_steps": 3} for n in range(4)),
]
IDS = {row["id"] for row in ROWS}


@pytest.fixture
def stoppable_s3():
    """A moto_server of this test's own (it is stopped mid-run), with a fresh bucket."""
    with MotoServer() as server:
        bucket = server.endpoint.create_bucket()
        yield server, f"s3://{bucket}/run"
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)  # a stopped server cannot be terminated cleanly


def _intact_outputs(store: RunStore, ids: set[str]) -> None:
    for job_id in ids:
        record = store.read_done(job_id)
        data = store.fs.cat_file(store.fs._strip_protocol(record["output_uri"]))
        assert hashlib.sha256(data).hexdigest() == record["output_sha256"], job_id


@pytest.mark.slow
def test_store_stopped_mid_run_exits_75_keeps_what_was_done_and_a_rerun_finishes(stoppable_s3, tmp_path):
    server, url = stoppable_s3
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS)
    command = ("run", manifest, "--out", url, "-q", "--nproc", "2", "--checkpoint-every", "2",
               "--storage-timeout", str(TIMEOUT_S))
    store = RunStore(url, server.endpoint.storage_options())  # straight to the server
    with FaultyProxy(server.endpoint.endpoint_url) as proxy:
        proxy.hold(lambda method, path: method == "PUT" and "/checkpoints/long.ckpt" in path)
        process = start_gen(*command, env={**server.endpoint.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url})
        wait_until(lambda: proxy.held and len(store.done_ids()) >= 1, process, what="the run before the outage")
        os.kill(server.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        proxy.release()  # the held upload goes on to the stopped server
        try:
            _, stderr = process.communicate(timeout=120)
            took = time.monotonic() - stopped
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
    assert process.returncode == exit_codes.REQUEUE, stderr
    assert "--storage-timeout" in stderr and "state kept" in stderr, stderr
    # the bound: one failed operation (TIMEOUT_S) and the rest of the long job's compute, not minutes
    assert took < 60, f"the run took {took:.0f} s to stop after the store did"

    done = store.done_ids()
    assert done and "long" not in done, done
    _intact_outputs(store, done)
    assert store.failed_ids() == set(), "the outage was counted as a job failure"

    options = [f"--storage-option={key}={value}" for key, value in (
        ("endpoint_url", server.endpoint.endpoint_url), ("key", server.endpoint.key),
        ("secret", server.endpoint.secret), ("client_kwargs.region_name", server.endpoint.region))]
    resumed = run_cli("run", manifest, "--out", url, "-q", "--storage-timeout", str(TIMEOUT_S), *options)
    assert resumed.returncode == 0, resumed.stderr
    assert store.done_ids() == IDS and store.failed_ids() == set()
    _intact_outputs(store, IDS)
    rerun = [ids for attempt, ids in encoded_by_attempt(store).items() if attempt == store.read_run_info()["run_id"]]
    assert rerun and not rerun[0] & done, "a job done before the outage was generated again"
    assert {row["status"] for row in store.read_results().to_pylist()} == {"done"}


def test_no_such_bucket_exits_2_on_every_rank(moto_endpoint, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS[1:2])
    result = gen("run", manifest, "--out", "s3://gb-no-such-bucket-here/run", "-q", "--nproc", "2",
                 "--storage-timeout", str(TIMEOUT_S), env=moto_endpoint.env(), timeout=120)
    assert result.returncode == exit_codes.USAGE, result.stderr
    assert "bucket exists" in result.stderr and "s3://gb-no-such-bucket-here/run" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.fixture(scope="module")
def moto_with_auth():
    """A moto_server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0): unknown keys get 403."""
    with MotoServer(extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server.endpoint


def test_access_denied_exits_2_naming_the_credentials(moto_with_auth, tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS[1:2])
    started = time.monotonic()
    result = run_cli("run", manifest, "--out", "s3://anybucket/run", "-q", "--storage-timeout", "60",
                     f"--storage-option=endpoint_url={moto_with_auth.endpoint_url}",
                     "--storage-option=key=AKIANOTAREALKEY00000", "--storage-option=secret=wrong")
    assert result.returncode == exit_codes.USAGE, result.stderr
    assert "credentials" in result.stderr and time.monotonic() - started < 30, "a 403 must not be retried"


def test_status_of_a_run_on_a_store_that_is_down_exits_75_within_its_bound():
    started = time.monotonic()
    result = run_cli("status", "s3://bucket/run", "--storage-timeout", "1",
                     f"--storage-option=endpoint_url=http://127.0.0.1:{free_port()}",
                     "--storage-option=key=testing", "--storage-option=secret=testing")
    assert result.returncode == exit_codes.REQUEUE, result.stderr
    assert "s3://bucket/run" in result.stderr and time.monotonic() - started < 10
