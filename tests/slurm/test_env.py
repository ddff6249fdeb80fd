"""The Slurm environment -> SlurmContext, array shares and torchrun arguments."""

import pytest

from genbatch.cluster.slurm_env import (
    RENDEZVOUS_PORT_BASE,
    RENDEZVOUS_PORT_SPAN,
    SlurmContext,
    array_share,
    rendezvous_port,
)
from genbatch.slurm.launch import torchrun_args

# What a task of a 2-node, 2-tasks-per-node job saw on the local cluster (trimmed to the variables read).
TASK_3 = {
    "SLURM_JOB_ID": "884308", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
    "SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
}


def _array_task(task_id, task_min, task_max, count, step=1):
    return {"SLURM_JOB_ID": str(900 + task_id), "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_ARRAY_JOB_ID": "900", "SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_ARRAY_TASK_MIN": str(task_min),
            "SLURM_ARRAY_TASK_MAX": str(task_max), "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_STEP": str(step)}


def test_context_from_a_multi_node_task():
    ctx = SlurmContext.from_environ(TASK_3)
    assert (ctx.job_id, ctx.num_nodes, ctx.hostnames) == (884308, 2, ("n1", "n2"))
    assert (ctx.proc_id, ctx.node_id, ctx.local_id, ctx.restart_count) == (3, 1, 1, 0)
    assert ctx.head_node == "n1" and not ctx.in_array and ctx.array_share() is None


def test_outside_slurm_there_is_no_context_and_no_share():
    assert SlurmContext.from_environ({"HOME": "/root"}) is None
    assert array_share({}) is None


def test_restart_count_and_old_variable_names():
    ctx = SlurmContext.from_environ({"SLURM_JOBID": "7", "SLURM_NODELIST": "a[1-3]", "SLURM_NNODES": "3",
                                     "SLURM_RESTART_COUNT": "2"})
    assert (ctx.job_id, ctx.num_nodes, ctx.hostnames, ctx.restart_count) == (7, 3, ("a1", "a2", "a3"), 2)


@pytest.mark.parametrize(
    ("env", "share"),
    [
        (_array_task(0, 0, 2, 3), (0, 3)),
        (_array_task(2, 0, 2, 3), (2, 3)),
        (_array_task(3, 1, 3, 3), (2, 3)),  # --array=1-3: positions, not indices
        (_array_task(6, 0, 6, 3, step=3), (2, 3)),  # --array=0-6:3 (as Slurm 22.05 sets it)
        (_array_task(4, 2, 4, 3), (2, 3)),  # --array=2-4%1 (the throttle changes nothing)
    ],
)
def test_array_share_is_the_task_position(env, share):
    assert array_share(env) == share


def test_array_share_without_count_uses_max():
    env = _array_task(1, 0, 3, 4)
    del env["SLURM_ARRAY_TASK_COUNT"]
    assert array_share(env) == (1, 4)


def test_uneven_array_indices_name_the_fix():
    # --array=1,5,6: Slurm sets MIN=1 MAX=6 STEP=1 COUNT=3, so a position cannot be derived
    with pytest.raises(ValueError, match="--share K/N"):
        array_share(_array_task(5, 1, 6, 3))


def test_inconsistent_environment_is_refused():
    with pytest.raises(ValueError, match="SLURM_JOB_NUM_NODES=3"):
        SlurmContext.from_environ({**TASK_3, "SLURM_JOB_NUM_NODES": "3"})
    with pytest.raises(ValueError, match="SLURM_PROCID='x'"):
        SlurmContext.from_environ({**TASK_3, "SLURM_PROCID": "x"})


def test_torchrun_args_rendezvous_on_the_first_node():
    ctx = SlurmContext.from_environ(TASK_3)
    assert torchrun_args(ctx, 8) == [
        "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=n1:24308",
        "--rdzv-id=884308", "--max-restarts=0",
    ]
    with pytest.raises(ValueError, match="nproc_per_node=0"):
        torchrun_args(ctx, 0)


def test_rendezvous_port_is_stable_in_range_and_differs_for_neighbours():
    ports = [rendezvous_port(job_id) for job_id in range(123_456, 123_456 + 50)]
    assert len(set(ports)) == 50
    assert all(RENDEZVOUS_PORT_BASE <= port < RENDEZVOUS_PORT_BASE + RENDEZVOUS_PORT_SPAN for port in ports)
    assert max(ports) < 32768  # below Linux's ephemeral range
    assert rendezvous_port(123_456) == rendezvous_port(123_456)
