"""SIGUSR1 / SIGTERM to a running `gen run` (one process; `--nproc 2` with dp 2 and with ulysses 2; local and
S3 output): every rank stops at the next step boundary, every group checkpoints its job, finished uploads
are flushed, the exit status is 75; the rerun continues each interrupted job from its checkpoint step (its
timings say so) and ends with outputs identical to an uninterrupted run of the same layout."""

from __future__ import annotations

import signal

import pytest

from genbatch.io import RunStore
from genbatch.runner import exit_codes
from tests.conftest import fresh_s3_run
from tests.resume.common import checkpoint_steps, manifest_and_reference, outputs, steps_by_attempt, wait_until
from tests.support.runs import gen, start_gen

LONG = 60  # steps of the long jobs: the signal lands well inside one
FOX = {"prompt": "a fox running through snow", "model": "tiny-wan", "num_inference_steps": LONG, "seed": 17}
ROWS = [
    {"id": "warm-up", "prompt": "a lighthouse at dusk", "model": "tiny-flux", "num_inference_steps": 3},
    {"id": "long-a", **FOX},
    {"id": "long-b", "prompt": "an owl on a branch at night", "model": "tiny-wan", "num_inference_steps": LONG},
    {"id": "twin-a", **FOX},  # long-a's twin, run whole by the rerun: the same-layout uninterrupted output
]
IDS = {row["id"] for row in ROWS}
LAYOUTS = {  # name: (gen run arguments, job groups, ranks per job group)
    "one-process": ((), 1, 1),
    "dp2": (("--nproc", "2"), 2, 1),
    "ulysses2": (("--nproc", "2", "--ulysses", "2"), 1, 2),
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The manifest, and its outputs in one process (dp only changes which rank runs a job, not its output)."""
    return manifest_and_reference(tmp_path_factory, ROWS)


def _out_for(where: str, request, tmp_path) -> tuple[str, dict, dict]:
    """(--out URL, storage options for reading it back, env for the subprocess)."""
    if where == "local":
        return str(tmp_path / "out"), {}, {}
    s3_run = next(fresh_s3_run(request.getfixturevalue("moto_endpoint")))  # the bucket outlives the test
    return s3_run.url, s3_run.storage_options, s3_run.env


@pytest.mark.parametrize(("layout", "signum", "where"), [  # each layout, each signal, each kind of store once
    ("one-process", signal.SIGTERM, "s3"),
    ("dp2", signal.SIGTERM, "local"),
    ("ulysses2", signal.SIGUSR1, "local"),
], ids=["one-process-TERM-s3", "dp2-TERM", "ulysses2-USR1"])
def test_signal_checkpoints_exits_75_and_the_rerun_continues(layout, signum, where, uninterrupted, request, tmp_path):
    manifest, reference = uninterrupted
    args, groups, group_size = LAYOUTS[layout]
    out, options, env = _out_for(where, request, tmp_path)
    store = RunStore(out, options)
    command = ("run", manifest, "--out", out, "-q", "--checkpoint-every", "5", *args)

    def every_group_early_in_a_job() -> bool:  # so the signal surely lands inside those jobs
        return sum(step <= LONG - 25 for step in checkpoint_steps(store).values()) >= groups

    process = start_gen(*command, env=env)
    wait_until(every_group_early_in_a_job, process, what="the first attempt")
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == exit_codes.REQUEUE, stderr

    stopped_at, done = checkpoint_steps(store), store.done_ids()
    assert len(stopped_at) == groups, (stopped_at, done, stderr[-3000:])  # every group checkpointed its job
    assert all(5 <= step < LONG for step in stopped_at.values()) and not done & set(stopped_at), stopped_at
    assert "warm-up" in done and outputs(store)["warm-up.png"] == reference["warm-up.png"]  # upload flushed
    if groups == 1:
        assert set(stopped_at) == {"long-a"}  # so its twin, run whole by the rerun, is the reference below
    first_attempt = steps_by_attempt(store)
    for job_id, step in stopped_at.items():
        (ranks,) = first_attempt[job_id].values()
        assert len(ranks) == group_size  # every rank of the group stopped after the same step
        assert all(steps == list(range(step)) for steps in ranks.values()), ranks

    resumed = gen(*command, env=env)
    assert resumed.returncode == exit_codes.OK, resumed.stderr
    assert store.done_ids() == IDS
    assert checkpoint_steps(store) == {}  # deleted once their jobs were done
    final = outputs(store)
    assert final["long-a.mp4"] == final["twin-a.mp4"]  # resumed == uninterrupted, in the same layout
    if layout != "ulysses2":  # sequence parallel changes float rounding: compared within its own run only
        assert final == reference
    for job_id, step in stopped_at.items():
        attempts = steps_by_attempt(store)[job_id]
        later = [ranks for attempt, ranks in attempts.items() if attempt not in first_attempt[job_id]]
        assert len(later) == 1 and len(later[0]) == group_size
        assert all(steps == list(range(step, LONG)) for steps in later[0].values())  # not from step 0
