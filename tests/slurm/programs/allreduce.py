"""A small torchrun worker for the Slurm machinery tests (no genbatch run involved).

    allreduce.py OUT_DIR [--wait-signal] [--rank1-exit CODE]

Joins the gloo group torchrun set up, all-reduces rank + 1, and writes OUT_DIR/<restart>-rank<r>.json with what
it saw (rank, world size, the sum, the Slurm and CUDA environment, genbatch's view of the array share). With
--wait-signal, on the job's first run only, it then waits for SIGUSR1 and exits 75 (as `gen run` does when
it checkpoints), so the test can check the signal path and the requeue. With --rank1-exit CODE, rank 1 exits
with CODE instead of 0 (a failing worker).
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from genbatch.parallel.teardown import exit_process
from genbatch.cluster.slurm_env import SlurmContext

received = []
signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
out_dir, wait_signal = sys.argv[1], "--wait-signal" in sys.argv
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
ctx = SlurmContext.from_environ()
restart = ctx.restart_count
record = {
    "rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": total.item(),
    "local_rank": int(os.environ["LOCAL_RANK"]), "node_id": ctx.node_id, "hostnames": list(ctx.hostnames),
    "share": ctx.array_share(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "restart_count": restart, "signalled": False,
}
task = "" if ctx.array_task_id is None else f"task{ctx.array_task_id}-"
path = os.path.join(out_dir, f"{task}restart{restart}-rank{dist.get_rank()}.json")
if wait_signal and restart == 0:
    with open(path + ".ready", "w") as handle:  # the test signals once every rank is here
        handle.write("ready")
    deadline = time.monotonic() + 120
    while not received and time.monotonic() < deadline:
        time.sleep(0.05)
    record["signalled"] = bool(received)
with open(path, "w") as handle:
    json.dump(record, handle)
status = 0
if record["signalled"]:
    status = 75
elif "--rank1-exit" in sys.argv and record["rank"] == 1:
    status = int(sys.argv[sys.argv.index("--rank1-exit") + 1])
exit_process(status)  # leaves the group; never dies of torch's worker threads on the way out
