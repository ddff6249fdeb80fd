"""The crash harness (harness.py) for a few trials, on the local store and on moto_server; `bench/crash.py
--trials 20` runs the full count and prints the numbers. After every kill the harness checks that no process
of the killed attempt outlives it by 10 s."""

from __future__ import annotations

import random
import time

import pytest

from tests.conftest import fresh_s3_run
from tests.resume.harness import KILLS, Target, crash_trials, uninterrupted_outputs, write_crash_manifest

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool


@pytest.fixture(scope="module")
def crash_manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    manifest = write_crash_manifest(str(root / "m.parquet"))
    return manifest, uninterrupted_outputs(manifest, str(root / "reference"))


@pytest.mark.slow  # the harness's closed-pipe kills: test_stop_closed_pipe.py's launcher deaths hold this in make test
def test_a_launcher_killed_with_its_pipes_closed_leaves_no_process_behind(crash_manifest, tmp_path):
    manifest, reference = crash_manifest
    report = crash_trials(lambda index: Target(url=str(tmp_path / f"trial{index}")), manifest=manifest,
                          reference=reference, trials=1, rng=random.Random(5), max_kills=2, kills=("group", "usr1"),
                          pipe_share=1.0)
    print(report.line("local"))
    assert report.violations == [] and report.orphans == 0
    assert report.kills == report.closed_pipes >= 1 and report.attempts == report.kills + 1


@pytest.mark.slow
def test_sigkill_at_random_moments_local(crash_manifest, tmp_path):
    manifest, reference = crash_manifest
    report = crash_trials(lambda index: Target(url=str(tmp_path / f"trial{index}")), manifest=manifest,
                          reference=reference, trials=1, rng=random.Random(11), max_kills=1)
    print(report.line("local"))
    assert report.violations == []
    assert report.kills == 1 and report.attempts == 2


@pytest.mark.slow
def test_sigkill_at_random_moments_s3(crash_manifest, moto_endpoint):
    manifest, reference = crash_manifest
    runs = []

    def new_target(index: int) -> Target:
        run = next(fresh_s3_run(moto_endpoint))
        runs.append(run)
        return Target(url=run.url, storage_options=run.storage_options, env=run.env,
                      open_uploads=lambda: run.endpoint.filesystem().list_multipart_uploads(run.bucket))

    report = crash_trials(new_target, manifest=manifest, reference=reference, trials=1,
                          rng=random.Random(12), max_kills=2, kills=KILLS, pipe_share=0.5)
    print(report.line("s3"))
    for run in runs:
        run.endpoint.delete_bucket(run.bucket)
    assert report.violations == [] and report.orphans == 0
    assert report.kills >= 1 and report.attempts == report.kills + 1


def test_the_harness_finds_a_process_by_the_run_on_its_command_line(tmp_path):
    import subprocess
    import sys

    from tests.resume.harness import processes_of

    marker = str(tmp_path / "run")
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--out", marker])
    try:
        deadline = time.monotonic() + 30
        while not processes_of(marker) and time.monotonic() < deadline:  # until the child has exec'd its command
            time.sleep(0.05)
        assert processes_of(marker) == [process.pid] and processes_of(marker + "-other") == []
    finally:
        process.kill()
        process.wait()
    assert processes_of(marker) == []
