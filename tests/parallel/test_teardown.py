"""How a process that ran collectives ends: with its own status and its output flushed, without finalization.

The crash this avoids (a gloo worker thread dropping a finished collective's tensor while the interpreter
finalizes: SIGABRT after a successful run) is a race; these tests pin the mechanism that closes it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from genbatch.parallel import teardown
from tests.support.distributed import free_port

pytestmark = pytest.mark.processes  # each test is about processes: fresh ones, never the pool

PROGRAM = textwrap.dedent(
    """
    import atexit, os, sys
    import torch, torch.distributed as dist
    from genbatch.parallel.teardown import exit_process

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    out = torch.empty(8)
    dist.all_gather_into_tensor(out, torch.arange(8.0))
    del out  # the worker thread may now hold the last reference: the situation that crashed
    atexit.register(lambda: print("finalization ran", flush=True))
    print("gathered", end="")  # unflushed: exit_process must flush it
    exit_process(int(sys.argv[2]))
    """
)


@pytest.mark.parametrize("status", [0, 75])
def test_a_process_that_ran_collectives_exits_with_its_status_and_flushed_output(status):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(free_port()), str(status)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout == "gathered", "the output is flushed and the interpreter's finalization is skipped"


def test_a_process_without_collectives_exits_the_usual_way(monkeypatch):
    monkeypatch.setattr(teardown, "_joined", False)
    assert not dist.is_initialized()
    with pytest.raises(SystemExit) as exit_info:
        teardown.exit_process(3)
    assert exit_info.value.code == 3
