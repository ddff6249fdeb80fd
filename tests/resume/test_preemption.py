"""SIGUSR1 / SIGTERM to a running `gen run` (one process; `--nproc 2` with dp 2 and with ulysses 2; local and
S3 output): every rank stops at the next step boundary, every group checkpoints its job, finished uploads
are flushed, the exit status is 75; the rerun continues each interrupted job from its checkpoint step (its
timings say so) and ends with outputs identical to an uninterrupted run of the same layout.

The signal must land while every job group is inside a job. With one group, a checkpoint early in a long job
shows that. With several, each group's progress is its own, and a group can finish its jobs before another has
started one: so the dp 2 case writes through a proxy that holds the checkpoint uploads, and each group stops
(its writer's queue full) inside its job, a state it cannot skip past; the test signals once the proxy holds
a checkpoint of every group's job, then lets the uploads through."""

from __future__ import annotations

import contextlib
import signal
import urllib.parse

import pytest

from genbatch.io import RunStore
from genbatch.jobs import exit_codes
from tests.conftest import fresh_s3_run
from tests.resume.common import checkpoint_steps, manifest_and_reference, outputs, steps_by_attempt, wait_until
from tests.support.faulty_proxy import FaultyProxy
from tests.support.runs import gen, start_gen

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

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


@contextlib.contextmanager
def _out_for(where: str, request, tmp_path):
    """(--out URL, storage options for reading it back, env for the subprocess, a proxy holding the
    checkpoint uploads or None)."""
    if where == "local":
        yield str(tmp_path / "out"), {}, {}, None
        return
    s3_run = next(fresh_s3_run(request.getfixturevalue("moto_endpoint")))  # the bucket outlives the test
    if where == "s3":
        yield s3_run.url, s3_run.storage_options, s3_run.env, None
        return
    with FaultyProxy(s3_run.endpoint.endpoint_url) as proxy:  # "s3-held"
        # the long jobs' checkpoints (the warm-up runs whole: its upload is the one the test sees flushed)
        proxy.hold(lambda method, path: method == "PUT" and "/checkpoints/" in path and "warm-up" not in path)
        yield s3_run.url, s3_run.storage_options, {**s3_run.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}, proxy


def _held_jobs(proxy: FaultyProxy) -> set[str]:
    """Ids of the jobs whose checkpoint upload the proxy holds."""
    names = (urllib.parse.urlsplit(path).path.rsplit("/", 1)[-1] for path in proxy.held)
    return {name.removesuffix(".ckpt") for name in names}


@pytest.mark.parametrize(("layout", "signum", "where"), [  # each layout, each signal, each kind of store once
    pytest.param("one-process", signal.SIGTERM, "s3", marks=pytest.mark.slow),
    pytest.param("dp2", signal.SIGTERM, "s3-held", marks=pytest.mark.slow),
    # make test: tests/slurm's preempted job (USR1, checkpoint, exit 75, requeue, same outputs) covers this path
    pytest.param("ulysses2", signal.SIGUSR1, "local", marks=pytest.mark.slow),
], ids=["one-process-TERM-s3", "dp2-TERM", "ulysses2-USR1"])
def test_signal_checkpoints_exits_75_and_the_rerun_continues(layout, signum, where, uninterrupted, request, tmp_path):
    manifest, reference = uninterrupted
    with _out_for(where, request, tmp_path) as (out, options, env, proxy):
        _signal_then_rerun(manifest, reference, layout, signum, out, options, env, proxy)


def _signal_then_rerun(manifest, reference, layout, signum, out, options, env, proxy) -> None:
    args, groups, group_size = LAYOUTS[layout]
    store = RunStore(out, options)
    every = "1" if proxy else "5"  # held uploads: a group's writer queue fills within a few steps
    command = ("run", manifest, "--out", out, "-q", "--checkpoint-every", every, *args)

    def every_group_early_in_a_job() -> bool:  # so the signal surely lands inside those jobs
        if proxy is not None:
            return len(_held_jobs(proxy)) >= groups
        return sum(step <= LONG - 25 for step in checkpoint_steps(store).values()) >= groups

    process = start_gen(*command, env=env)
    wait_until(every_group_early_in_a_job, process, what="the first attempt")
    process.send_signal(signum)
    if proxy is not None:
        proxy.release()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == exit_codes.REQUEUE, stderr

    stopped_at, done = checkpoint_steps(store), store.done_ids()
    assert len(stopped_at) == groups, (stopped_at, done, stderr[-3000:])  # every group checkpointed its job
    first = int(every)  # the first checkpoint: each group was at it, or past it, when signalled
    assert all(first <= step < LONG for step in stopped_at.values()) and not done & set(stopped_at), stopped_at
    assert "warm-up" in done and outputs(store)["warm-up.png"] == reference["warm-up.png"]  # upload flushed
    if groups == 1:
        assert set(stopped_at) == {"long-a"}  # so its twin, run whole by the rerun, is the reference below
    first_attempt = steps_by_attempt(store)
    for job_id, step in stopped_at.items():
        (ranks,) = first_attempt[job_id].values()
        assert len(ranks) == group_size  # every rank of the group stopped after the same step
        assert all(steps == list(range(step)) for steps in ranks.values()), ranks

    resumed = gen(*command, env=env)  # (through the proxy, released: nothing is held any more)
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
