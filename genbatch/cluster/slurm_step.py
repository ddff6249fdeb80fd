"""A job step that srun started with one task per GPU and no torchrun: the process group from Slurm's variables.

    srun --ntasks-per-node=8 gen run prompts.parquet --out OUT --ulysses 4

Each task is a rank: RANK = SLURM_PROCID, WORLD_SIZE = SLURM_STEP_NUM_TASKS, LOCAL_RANK = SLURM_LOCALID, and
the rendezvous (MASTER_ADDR:MASTER_PORT, torch.distributed's `env://`) on the step's first node at the job's
rendezvous port. torchrun sets these variables itself, so under torchrun nothing here applies; the batch
shell is no step (no SLURM_STEP_NUM_TASKS), so `gen run` typed there stays one process. MASTER_ADDR and
MASTER_PORT already in the environment win (a script that exports its own).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from genbatch.cluster.hostlist import expand_hostlist
from genbatch.cluster.slurm_env import SlurmContext, int_variable, rendezvous_port

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(spec: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE -> tasks on each node, in node order: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise ValueError(f"tasks per node {spec!r}: {item!r} is neither N nor N(xK); not set by Slurm")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def step_process_group_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """torch.distributed's `env://` variables for a task of a multi-task srun step without torchrun; empty
    when torchrun set them (WORLD_SIZE), outside a step, or with one task."""
    env = os.environ if environ is None else environ
    world_size = int_variable(env, "SLURM_STEP_NUM_TASKS")
    if "WORLD_SIZE" in env or world_size is None or world_size < 2 or "SLURM_PROCID" not in env:
        return {}
    job = SlurmContext.from_environ(env)
    if job is None:
        raise ValueError("SLURM_STEP_NUM_TASKS is set but SLURM_JOB_ID is not; run gen inside `srun`")
    step_nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST", "")) or list(job.hostnames)
    node = env.get("SLURMD_NODENAME")
    node_index = step_nodes.index(node) if node in step_nodes else job.node_id  # a step may use some nodes only
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or str(world_size))
    return {
        "RANK": str(job.proc_id),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(job.local_id),
        "LOCAL_WORLD_SIZE": str(per_node[min(node_index, len(per_node) - 1)]),
        "MASTER_ADDR": env.get("MASTER_ADDR") or step_nodes[0],
        "MASTER_PORT": env.get("MASTER_PORT") or str(rendezvous_port(job.job_id)),
    }
