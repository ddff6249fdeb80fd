"""srun's tasks as the ranks of one run when no torchrun started them (a pure function of the environment)."""

import pytest

from genbatch.cluster.slurm_env import rendezvous_port
from genbatch.cluster.slurm_step import step_process_group_env, tasks_per_node

TASK_3_OF_4 = {  # what srun --nodes=2 --ntasks-per-node=2 gives its last task (measured on slurm-wlm 22.05)
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
}


@pytest.mark.parametrize(("spec", "counts"), [("4", [4]), ("2(x2)", [2, 2]), ("2(x3),1", [2, 2, 2, 1]),
                                               ("3,1", [3, 1])])
def test_tasks_per_node(spec, counts):
    assert tasks_per_node(spec) == counts


def test_tasks_per_node_refuses_what_slurm_does_not_write():
    with pytest.raises(ValueError, match="neither N nor N\\(xK\\)"):
        tasks_per_node("2x2")


def test_a_task_of_a_step_is_a_rank_with_the_rendezvous_on_the_first_node():
    assert step_process_group_env(TASK_3_OF_4) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1", "MASTER_PORT": str(rendezvous_port(4242)),
    }


def test_uneven_tasks_per_node_give_each_node_its_own_local_world():
    env = {**TASK_3_OF_4, "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_PROCID": "2",
           "SLURM_LOCALID": "0"}
    assert step_process_group_env(env)["LOCAL_WORLD_SIZE"] == "1"


def test_an_exported_rendezvous_wins():
    env = {**TASK_3_OF_4, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}
    assert (step_process_group_env(env)["MASTER_ADDR"], step_process_group_env(env)["MASTER_PORT"]) == \
        ("10.0.0.7", "29500")


@pytest.mark.parametrize("case", ["torchrun set the world", "the batch shell", "one task", "not slurm"])
def test_nothing_to_adopt(case):
    env = {
        "torchrun set the world": {**TASK_3_OF_4, "WORLD_SIZE": "8", "RANK": "5"},
        "the batch shell": {k: v for k, v in TASK_3_OF_4.items() if not k.startswith("SLURM_STEP")},
        "one task": {**TASK_3_OF_4, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"},
        "not slurm": {"HOME": "/root"},
    }[case]
    assert step_process_group_env(env) == {}


def test_a_step_on_some_nodes_of_the_job_counts_its_own_nodes():
    """A step on n3 and n4 of a four-node job: the rendezvous is on n3, this task's node is found by name."""
    env = {**TASK_3_OF_4, "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "3",
           "SLURM_STEP_NODELIST": "n[3-4]", "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURMD_NODENAME": "n4",
           "SLURM_PROCID": "3", "SLURM_LOCALID": "0"}
    got = step_process_group_env(env)
    assert (got["MASTER_ADDR"], got["LOCAL_WORLD_SIZE"], got["RANK"]) == ("n3", "1", "3")
