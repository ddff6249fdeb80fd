"""The Slurm environment of this process, read once into a typed record (pure: no torch, no Slurm commands).

    ctx = SlurmContext.from_environ()            # None outside a Slurm job
    rendezvous_port(ctx.job_id)                  # the job's c10d port, the same on every node
    array_share()                                # (task index, task count) inside a job array, else None

The runner reads it (array shares, srun tasks as ranks: `slurm_step`) and so does `genbatch.slurm.launch`
(torchrun's arguments), which sits above the runner.

genbatch reads SLURM_* variables and never sets any: srun and sbatch read SLURM_* and SBATCH_* variables as
options (a stray SLURM_GPUS_PER_NODE changes every srun in the job).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from genbatch.cluster.hostlist import expand_hostlist

RENDEZVOUS_PORT_BASE = 20000
"""The lowest rendezvous port. Ports 20000-29999 sit below Linux's ephemeral range (32768-60999), so no
outgoing connection holds them, and above Slurm's own (6817/6818) and most well-known services."""
RENDEZVOUS_PORT_SPAN = 10000
"""How many ports the job id is folded into: jobs whose ids differ by a multiple of this share a port."""


def rendezvous_port(job_id: int) -> int:
    """The c10d rendezvous port of a job: the same on every node and across requeues, different for
    neighbouring jobs (including the tasks of one array, which have ids of their own)."""
    return RENDEZVOUS_PORT_BASE + job_id % RENDEZVOUS_PORT_SPAN


def int_variable(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """An integer Slurm variable, `default` when unset or empty; a clear error when it is not a number."""
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; this environment was not set by Slurm") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmContext:
    """Where this process sits in a Slurm job."""

    job_id: int
    """SLURM_JOB_ID: this job's id (an array task has its own)."""
    num_nodes: int
    """SLURM_JOB_NUM_NODES (or SLURM_NNODES): the nodes of the allocation."""
    hostnames: tuple[str, ...]
    """SLURM_JOB_NODELIST expanded, in Slurm's order; the first is where the rendezvous runs."""
    proc_id: int = 0
    """SLURM_PROCID: the task's rank among all tasks of the step (0 in the batch shell)."""
    node_id: int = 0
    """SLURM_NODEID: the node's index in the allocation."""
    local_id: int = 0
    """SLURM_LOCALID: the task's index on its node."""
    restart_count: int = 0
    """SLURM_RESTART_COUNT: how many times the job was requeued (0 on the first run)."""
    array_job_id: int | None = None
    """SLURM_ARRAY_JOB_ID: the id shared by all tasks of an array; None outside arrays."""
    array_task_id: int | None = None
    """SLURM_ARRAY_TASK_ID: this task's array index; None outside arrays."""
    array_task_min: int | None = None
    """SLURM_ARRAY_TASK_MIN: the lowest index of the array."""
    array_task_max: int | None = None
    """SLURM_ARRAY_TASK_MAX: the highest index of the array."""
    array_task_step: int = 1
    """SLURM_ARRAY_TASK_STEP: the stride between indices (`--array=0-9:2`)."""
    array_task_count: int | None = None
    """SLURM_ARRAY_TASK_COUNT: how many tasks the array has."""

    def __post_init__(self) -> None:
        if not self.hostnames:
            raise ValueError(f"job {self.job_id}: SLURM_JOB_NODELIST names no host; run inside an allocation")
        if self.num_nodes != len(self.hostnames):
            raise ValueError(
                f"job {self.job_id}: SLURM_JOB_NUM_NODES={self.num_nodes} but the node list has "
                f"{len(self.hostnames)} hosts {list(self.hostnames)}; the environment is not one job's"
            )

    @property
    def head_node(self) -> str:
        """The job's first node: it hosts the c10d rendezvous store."""
        return self.hostnames[0]

    @property
    def in_array(self) -> bool:
        return self.array_task_id is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SlurmContext | None:
        """Read the Slurm variables (from `os.environ` by default); None when not inside a Slurm job."""
        env = os.environ if environ is None else environ
        job_id = int_variable(env, "SLURM_JOB_ID", int_variable(env, "SLURM_JOBID"))
        if job_id is None:
            return None
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        hostnames = tuple(expand_hostlist(nodelist))
        return cls(
            job_id=job_id,
            num_nodes=int_variable(env, "SLURM_JOB_NUM_NODES",
                                   int_variable(env, "SLURM_NNODES", len(hostnames))),
            hostnames=hostnames,
            proc_id=int_variable(env, "SLURM_PROCID", 0),
            node_id=int_variable(env, "SLURM_NODEID", 0),
            local_id=int_variable(env, "SLURM_LOCALID", 0),
            restart_count=int_variable(env, "SLURM_RESTART_COUNT", 0),
            array_job_id=int_variable(env, "SLURM_ARRAY_JOB_ID"),
            array_task_id=int_variable(env, "SLURM_ARRAY_TASK_ID"),
            array_task_min=int_variable(env, "SLURM_ARRAY_TASK_MIN"),
            array_task_max=int_variable(env, "SLURM_ARRAY_TASK_MAX"),
            array_task_step=int_variable(env, "SLURM_ARRAY_TASK_STEP", 1),
            array_task_count=int_variable(env, "SLURM_ARRAY_TASK_COUNT"),
        )

    def array_share(self) -> tuple[int, int] | None:
        """(index, count) of this array task, index in range(count); None outside arrays.

        The index is the task's position in the array (`--array=1-3` gives 0, 1, 2), so the shares of an
        array cover the manifest exactly once. Arrays whose indices are not one even stride
        (`--array=1,5,6`) have no such position: those raise, naming `--share` as the fix.
        """
        if self.array_task_id is None:
            return None
        low = self.array_task_min if self.array_task_min is not None else 0
        step = self.array_task_step or 1
        count = self.array_task_count
        if count is None and self.array_task_max is not None:
            count = (self.array_task_max - low) // step + 1
        if count is None:
            raise ValueError(
                f"array task {self.array_task_id}: neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MAX is "
                "set; pass --share K/N to gen run"
            )
        even = self.array_task_max is None or (self.array_task_max - low) == (count - 1) * step
        if not even or (self.array_task_id - low) % step:
            raise ValueError(
                f"array task {self.array_task_id} of an array with uneven indices (min {low}, max "
                f"{self.array_task_max}, step {step}, {count} tasks) has no share position; submit a contiguous "
                "array such as --array=0-N or pass --share K/N to gen run"
            )
        return ((self.array_task_id - low) // step, count)


def array_share(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(index, count) when this process runs in a Slurm array task, else None. See SlurmContext.array_share."""
    ctx = SlurmContext.from_environ(environ)
    return None if ctx is None else ctx.array_share()
