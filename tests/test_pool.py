"""The pool of gloo ranks (tests/support/pool.py) hands each call a clean rank: after a call that builds a mesh,
compiles, installs step-cache hooks, changes signal handlers, the environment and torch's global state,
the next call finds none of it (but the mesh's groups, kept on purpose, and working); a failing or hanging call fails with every rank's traceback and the pool is
respawned; the ranks are spawned once for many calls."""

from __future__ import annotations

import os
import signal

import pytest
import torch
import torch.distributed as dist

from tests.support.distributed import run_on_ranks
from tests.support.pool import rank_pool

MARK = "GENBATCH_TEST_POOL_MARK"


def _sine(x):
    return x.sin() + 1


_COMPILED = torch.compile(_sine, backend="eager")
"""Kept by each pool rank across calls (this module is imported once there): its cache must not be."""


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def _wakeup_fd() -> int:
    previous = signal.set_wakeup_fd(-1)
    if previous != -1:
        signal.set_wakeup_fd(previous)
    return previous


def _reduce_over_every_group(c10d) -> bool:
    """Every group the rank holds still works (a kept mesh's groups included)."""
    for group in list(c10d._world.pg_map):
        if dist.get_rank() in dist.get_process_group_ranks(group):
            total = torch.ones(1)
            dist.all_reduce(total, group=group)
            if total.item() != group.size():
                return False
    return True


def _hooked(model) -> bool:
    return any(getattr(module, "_diffusers_hook", None) is not None for module in model.modules())


def _state(rank, world_size):
    import torch.distributed.distributed_c10d as c10d

    from genbatch.runner.presets import build_preset

    return {
        "hooks": _hooked(build_preset("tiny-flux").transformer),
        "groups": len(c10d._world.pg_map),
        "reduced": _reduce_over_every_group(c10d),
        "handlers": {signum: signal.getsignal(signum) is signal.SIG_DFL
                     for signum in (signal.SIGTERM, signal.SIGUSR1)},
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "wakeup": _wakeup_fd(),
        "mark": os.environ.get(MARK),
        "threads": torch.get_num_threads(),
        "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(),
        "draw": torch.rand(3).tolist(),
        "pid": os.getpid(),
    }


def _dirty(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh

    from genbatch.jobs.cache import parse_cache
    from genbatch.models import resolve_model
    from genbatch.parallel.cache.session import StepCache
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.runner.presets import build_preset
    from genbatch.runner.signals import StopRequest

    before = _state(rank, world_size)
    pipe = build_preset("tiny-flux")
    cache = StepCache.start(pipe, resolve_model("tiny-flux"), parse_cache("fbc:0.1"),
                            Comm(group=dist.group.WORLD, ledger=CommLedger()))  # never closed
    assert cache.hooked and _hooked(pipe.transformer)
    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("a", "b"))
    dist.all_reduce(torch.ones(2), group=mesh.get_group("b"))
    _COMPILED(torch.ones(4))
    StopRequest().install().watch()  # handlers, a wakeup fd and a watcher thread, never restored
    os.environ[MARK] = "left behind"
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.rand(100)
    dirty = _state(rank, world_size)
    return before, dirty


def _compile_count(rank, world_size):
    before = _frames_compiled()
    _COMPILED(torch.ones(4))
    return _frames_compiled() - before


def test_the_next_call_finds_nothing_a_call_left_behind():
    before, dirty = zip(*run_on_ranks(_dirty, world_size=2))
    assert all(state["groups"] > first["groups"] and state["mark"] and state["wakeup"] != -1
               and not state["sigint"] and state["dtype"] == torch.float64 for state, first in zip(dirty, before))
    assert run_on_ranks(_compile_count, world_size=2) == [1, 1]  # its compiled graph was dropped: compiled anew
    after = run_on_ranks(_state, world_size=2)
    for rank in range(2):
        assert after[rank]["pid"] == before[rank]["pid"]  # the same processes, put back
        assert after[rank]["groups"] == dirty[rank]["groups"] and after[rank]["reduced"]  # kept, and working
        assert {key: value for key, value in after[rank].items() if key not in ("draw", "groups")} == {
            key: value for key, value in before[rank].items() if key not in ("draw", "groups")}
        assert after[rank]["draw"] == before[rank]["draw"]  # the default generator as a fresh process has it


def _fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 waits for rank 1, until the call's gloo timeout
    return rank


def test_a_failing_call_names_each_ranks_error_and_the_pool_is_respawned():
    first = {result["pid"] for result in run_on_ranks(_state, world_size=2)}
    with pytest.raises(AssertionError) as failure:
        run_on_ranks(_fail_on_rank_1, world_size=2, timeout_s=3)
    assert "--- rank 1 ---" in str(failure.value) and "rank 1 fails on purpose" in str(failure.value)
    assert "--- rank 0 ---" in str(failure.value)  # its barrier timed out in seconds
    again = {result["pid"] for result in run_on_ranks(_state, world_size=2)}
    assert again.isdisjoint(first) and len(again) == 2


def _hang_on_rank_0(rank, world_size):
    import time

    if rank == 0:
        time.sleep(600)
    return rank


def test_a_hung_call_fails_with_the_hung_ranks_stacks():
    with pytest.raises(AssertionError) as failure:
        run_on_ranks(_hang_on_rank_0, world_size=2, timeout_s=0.5)
    assert "rank 0: no answer" in str(failure.value) and "_hang_on_rank_0" in str(failure.value)
    assert run_on_ranks(_state, world_size=2)[0]["groups"] >= 1  # respawned


def test_many_calls_share_one_spawn():
    pids = [tuple(result["pid"] for result in run_on_ranks(_state, world_size=2)) for _ in range(5)]
    assert len(set(pids)) == 1 and rank_pool(2).world_size == 2
