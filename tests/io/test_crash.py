"""SIGKILL a writer at random moments, rerun it until every job is done, and check after every kill that
no half-written output is ever taken for done; at the end: every job done exactly once with the right
bytes, no temp files or open multipart uploads left after the start-of-run clean-up."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genbatch.io import RunStore
from tests.conftest import fresh_s3_run
from tests.io.crash_writer import job_ids, media_for

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

REPO = Path(__file__).resolve().parents[2]
JOBS, SIZE = 12, 2 * 2**20


def _check_invariants(store: RunStore) -> set[str]:
    """Every done marker names a whole output with the expected bytes; returns the done ids."""
    done = store.done_ids()
    for job_id in done:
        record = store.read_done(job_id)
        data = store.fs.cat_file(store.layout.output(job_id, "mp4"))
        assert data == media_for(job_id, SIZE), f"{job_id} is done but its output is not whole"
        assert record["output_sha256"] == hashlib.sha256(data).hexdigest() and record["job"] == job_id
    return done


def _writer(url: str, options: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.io.crash_writer", url, json.dumps(options), str(JOBS), str(SIZE)]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)


def _crash_until_done(url: str, options: dict, seed: int, max_kills: int = 6) -> tuple[int, int, int]:
    """Run the writer; kill it at a random moment after a random job has started (all its writes, the
    background upload included, are in flight around then); after `max_kills` kills let one run finish."""
    rng = random.Random(seed)
    kills = runs = temps = 0
    while True:
        runs += 1
        store = RunStore(url, options)
        temps += store.recover()["removed_temps"]  # what the runner does at start-up
        remaining = JOBS - len(store.done_ids())
        proc = _writer(url, options)
        if kills < max_kills and remaining:
            target = rng.randrange(remaining)
            for _ in range(target + 1):
                if not proc.stdout.readline():
                    break
            time.sleep(rng.uniform(0.0, 0.01))  # short: a quiet machine finishes a local job in milliseconds
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        proc.communicate(timeout=120)
        _check_invariants(store)
        if proc.returncode == 0:
            print(f"{url}: {runs} runs, {kills} kills, {temps} temp files of killed writers removed, 0 violations")
            return runs, kills, temps
        assert proc.returncode == -signal.SIGKILL, f"writer failed with {proc.returncode}"


def _verify_final(store: RunStore) -> None:
    assert _check_invariants(store) == set(job_ids(JOBS))
    assert store.objects.list_names(store.layout.join("outputs")) == sorted(f"{j}.mp4" for j in job_ids(JOBS))
    assert store.objects.list_names(store.layout.join("checkpoints")) == []


def test_sigkill_local(tmp_path):
    url = str(tmp_path / "run")
    runs, kills, _ = _crash_until_done(url, {}, seed=1)
    store = RunStore(url)
    store.recover()
    _verify_final(store)
    leftovers = [p for p in Path(url).rglob("*") if p.is_file() and p.name.startswith(".")]
    assert leftovers == [], leftovers
    assert kills >= 3, f"{runs} runs, {kills} killed: the timing no longer exercises crashes"


def test_sigkill_s3(request):
    for run in fresh_s3_run(request.getfixturevalue("moto_endpoint")):
        runs, kills, _ = _crash_until_done(run.url, run.storage_options, seed=2, max_kills=4)
        store = RunStore(run.url, run.storage_options)
        store.recover()
        _verify_final(store)
        assert run.endpoint.filesystem().list_multipart_uploads(run.bucket) == []
        assert kills >= 3, f"{runs} runs, {kills} killed"
