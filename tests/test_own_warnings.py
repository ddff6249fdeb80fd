"""The check that `gen run --nproc 2 --ulysses 2` prints no warning of genbatch's own making
(tests/runner/test_rank_failure.py reads a real run's stderr with it) finds such a warning when there is one,
also where Python charges it to torch's file, and only then: a library's warning on import is the library's."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from tests.support.own_warnings import PACKAGE, genbatch_warnings, probe_env, probed_processes
from tests.support.runs import REPO

GATHERS = """
import os, sys, torch, torch.distributed as dist
from genbatch.parallel import comm

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
group = comm.Comm(dist.group.WORLD, comm.CommLedger())
group.all_gather_into(torch.zeros(2), torch.ones(2))  # as genbatch calls it now
print("--- the older name ---", file=sys.stderr, flush=True)
comm._all_gather_single = dist.all_gather_into_tensor  # as genbatch called it once: a FutureWarning
group.all_gather_into(torch.zeros(2), torch.ones(2))
# a library that warns while genbatch's code imports it: the library's warning, not genbatch's
exec(compile("import noisylib", os.path.join(os.path.dirname(comm.__file__), "flags.py"), "exec"),
     {"__name__": "genbatch.parallel.flags"})
dist.destroy_process_group()
"""


def test_a_deprecated_call_from_genbatchs_code_is_found_though_charged_to_torch(tmp_path):
    (tmp_path / "noisylib.py").write_text("import warnings\nwarnings.warn('noisylib warns on import')\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", **probe_env(os.pathsep.join((REPO, str(tmp_path))))}
    result = subprocess.run([sys.executable, "-c", GATHERS, str(tmp_path / "rendezvous")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert probed_processes(result.stderr) == 1
    now, older = result.stderr.split("--- the older name ---")
    assert genbatch_warnings(now) == [], now
    (found,) = genbatch_warnings(older)
    assert "caller=" + os.path.join(PACKAGE, "parallel", "comm.py") in found and "all_gather_into_tensor" in found
    # Python itself charges it to torch: only the probe's frames tell whose call it was
    printed = next(line for line in older.splitlines() if "FutureWarning" in line and "warning-origin" not in line)
    assert "torch" in printed.split(":", 1)[0] and not printed.startswith(PACKAGE), printed
    assert "noisylib warns on import" in older  # printed, with its origin, and not counted


def test_a_warning_charged_to_genbatchs_code_is_found_and_others_are_not():
    ours = warnings.formatwarning("all_gather_into_tensor is deprecated", FutureWarning,
                                  os.path.join(PACKAGE, "parallel", "comm.py"), 120)
    theirs = warnings.formatwarning("deprecated", DeprecationWarning, "/usr/lib/python3/site-packages/torch/x.py", 7)
    logged = "W1204 14:57:59.588000 25941 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass"
    stderr = "\n".join((logged, theirs, ours, "genbatch: 2 jobs done"))
    assert genbatch_warnings(stderr) == [f"{PACKAGE}/parallel/comm.py:120: FutureWarning: all_gather_into_tensor is "
                                         "deprecated"]
    assert genbatch_warnings("\n".join((logged, theirs))) == []
