"""The denoise loop's stop agreement on two gloo ranks: every rank stops after the same step, the group
syncs at most once per `interval` steps (counted twice: by the agreement and by the bytes its collectives
put in the ledger), and the stop lands within its bound in seconds after the signal."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch.distributed as dist

from genbatch.parallel.comm import Comm, CommLedger
from genbatch.runner.agreement import StopAgreement
from genbatch.runner.signals import StopRequest
from tests.support.distributed import run_on_ranks

STEP_S = 0.01
TARGET_S = 0.2
STEPS = 120


def _loop(rank, world_size, signal_rank, signal_step):
    """Synthetic steps of STEP_S seconds; rank `signal_rank` signals itself after step `signal_step`."""
    stop = StopRequest().install()
    ledger = CommLedger()
    agreement = StopAgreement(stop=stop, group=Comm(group=dist.group.WORLD, ledger=ledger), device="cpu",
                              target_s=TARGET_S)
    intervals, signalled_at = [], None
    try:
        for index in range(STEPS):
            time.sleep(STEP_S)  # the step's work
            steps_done = index + 1
            if rank == signal_rank and index == signal_step:
                os.kill(os.getpid(), signal.SIGUSR1)
                signalled_at = time.monotonic()
            before = agreement.syncs
            if agreement.should_stop(steps_done):
                return {"stopped_after": steps_done, "syncs": agreement.syncs, "intervals": intervals,
                        "delay_s": None if signalled_at is None else time.monotonic() - signalled_at,
                        "control_bytes": ledger.take().get("control", 0)}
            if agreement.syncs > before:
                intervals.append((steps_done, agreement.interval))
        return {"stopped_after": None, "syncs": agreement.syncs, "intervals": intervals}
    finally:
        stop.restore()


@pytest.mark.parametrize("signal_rank", [0, 1])
def test_the_group_stops_after_the_same_step_with_few_syncs_and_a_bounded_delay(signal_rank):
    signal_step = 57
    results = run_on_ranks(_loop, world_size=2, args=(signal_rank, signal_step))
    assert results[0]["stopped_after"] == results[1]["stopped_after"] is not None, results
    stopped_after = results[0]["stopped_after"]
    assert stopped_after > signal_step
    ours = results[signal_rank]
    # the interval follows the measured steps: about TARGET_S / STEP_S steps (fewer on a loaded machine)
    assert results[0]["intervals"] == results[1]["intervals"]  # the same rule on the same reduced values
    intervals = [interval for _, interval in ours["intervals"]]
    assert max(intervals) >= 3, intervals
    assert all(1 <= interval <= math.floor(TARGET_S / STEP_S) for interval in intervals), intervals
    # at most one blocking sync per interval: the first after step 1, then one at each interval's end
    expected_points, point = [], 1
    for steps_done, interval in ours["intervals"]:
        assert steps_done == point, ours["intervals"]
        expected_points.append(point)
        point += interval
    assert stopped_after == point  # the stop came at the next agreement point, not before or after
    assert ours["syncs"] == len(expected_points) + 1 < stopped_after / 2
    one_sync = 2 * (2 - 1) * 8 // 2  # an all_reduce of two float32 (8 bytes) on two ranks, as the ledger counts
    assert ours["control_bytes"] == ours["syncs"] * one_sync
    # the delay: at most one interval of steps (about TARGET_S) after the signal, plus slack for a busy host
    assert ours["delay_s"] <= TARGET_S + 2 * STEP_S + 1.0, ours["delay_s"]


def _one_rank(rank, world_size):
    stop = StopRequest().install()
    agreement = StopAgreement(stop=stop, group=Comm(group=None, ledger=CommLedger()), device="cpu")
    try:
        first = agreement.should_stop(1)
        os.kill(os.getpid(), signal.SIGTERM)
        return first, agreement.should_stop(2), agreement.syncs
    finally:
        stop.restore()


def test_a_group_of_one_reads_its_flag_at_every_step_without_a_sync():
    assert _one_rank(0, 1) == (False, True, 0)


def test_the_interval_rule():
    agreement = StopAgreement(stop=None, group=None, device="cpu", target_s=2.0, max_interval=100)
    assert agreement.next_interval(0.5) == 4
    assert agreement.next_interval(3.0) == 1  # slower steps than the target: agree at every step
    assert agreement.next_interval(0.001) == 100
    assert agreement.next_interval(0.0) == 100
    of_a_job = StopAgreement(stop=None, group=None, device="cpu", target_s=2.0, total_steps=60)
    assert of_a_job.next_interval(0.001) == 6  # fast steps: still ten agreements in the job
    assert of_a_job.next_interval(0.5) == 4
    assert StopAgreement(stop=None, group=None, device="cpu", total_steps=4).next_interval(0.001) == 1
