"""The Slurm machinery on a real cluster, with jobs we control (a small torchrun/gloo program, no gen run):
scripts rendered by genbatch run one launcher per node under srun, arrays get their shares, USR1 reaches
the workers, exit 75 requeues the job and the next run sees SLURM_RESTART_COUNT=1.

The three jobs are submitted together (the cluster has room for all of them) and each test waits for its own.
"""

import json
import sys
import time
from pathlib import Path

import pytest

from genbatch.slurm.sbatch import SbatchSpec, render_sbatch

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]
PROGRAM = str(Path(__file__).parent / "programs" / "allreduce.py")


def _records(directory: Path) -> list[dict]:
    records = (json.loads(path.read_text()) for path in directory.glob("*.json"))
    return sorted(records, key=lambda r: (r["restart_count"], r["rank"]))


def _submit(cluster, root: Path, name: str, *program_args: str, **spec_fields) -> tuple[int, Path]:
    out = root / name
    out.mkdir(parents=True)
    spec = SbatchSpec(command=(sys.executable, PROGRAM, str(out), *program_args), python=sys.executable,
                      job_name=name, log_dir=str(root / "logs"), **spec_fields)
    script = root / f"{name}.sbatch"
    script.write_text(render_sbatch(spec))
    return cluster.sbatch(str(script)), out


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-machinery")
    (root / "logs").mkdir()
    return root, {
        "allreduce": _submit(slurm_cluster, root, "allreduce", nodes=2, procs_per_node=2, gpus_per_node=2),
        "array": _submit(slurm_cluster, root, "array", nodes=1, procs_per_node=1, array=3),
    }


def _log(root: Path, name: str) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((root / "logs").glob(f"{name}-*")))


def _assert_completed(cluster, root, name, records):
    assert [r["JobState"] for r in records] == ["COMPLETED"] * len(records), _log(root, name)
    assert {r["ExitCode"] for r in records} == {"0:0"}, _log(root, name)


def test_two_nodes_two_processes_each_with_gpus(slurm_cluster, jobs):
    root, submitted = jobs
    job_id, out = submitted["allreduce"]
    _assert_completed(slurm_cluster, root, "allreduce", slurm_cluster.wait_finished(job_id, timeout_s=180))
    records = _records(out)
    assert [(r["rank"], r["world_size"], r["sum"]) for r in records] == [(rank, 4, 10.0) for rank in range(4)]
    assert sorted((r["node_id"], r["local_rank"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {tuple(r["hostnames"]) for r in records} == {("n1", "n2")}
    assert {r["cuda_visible_devices"] for r in records} == {"0,1"}  # --gpus-per-node=2 on the fake GPUs


def test_array_tasks_get_one_share_each(slurm_cluster, jobs):
    root, submitted = jobs
    job_id, out = submitted["array"]
    tasks = slurm_cluster.wait_until(
        job_id, lambda rs: len(rs) == 3 and all(r["JobState"] in {"COMPLETED", "FAILED"} for r in rs), 180)
    _assert_completed(slurm_cluster, root, "array", tasks)
    assert sorted(tuple(r["share"]) for r in _records(out)) == [(0, 3), (1, 3), (2, 3)]


@pytest.mark.slow  # test_cluster_genbatch's preempted job covers USR1, exit 75 and the requeue in make test
def test_usr1_reaches_the_workers_and_exit_75_requeues(slurm_cluster, jobs):
    root, _ = jobs
    job_id, out = _submit(slurm_cluster, root, "requeue", "--wait-signal", nodes=2, procs_per_node=2)
    deadline = time.monotonic() + 180
    while len(list(out.glob("*.ready"))) < 4:  # every rank is up and waiting
        assert time.monotonic() < deadline, _log(root, "requeue")
        time.sleep(0.2)
    # what `--signal=B:USR1@grace` does: USR1 to the batch shell only; its trap passes it to the step
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", str(job_id))
    records = slurm_cluster.wait_until(
        job_id, lambda rs: rs[0]["JobState"] in {"COMPLETED", "FAILED"} and rs[0]["Restarts"] == "1", 180)
    _assert_completed(slurm_cluster, root, "requeue", records)
    first, second = [[r for r in _records(out) if r["restart_count"] == n] for n in (0, 1)]
    assert [r["signalled"] for r in first] == [True] * 4
    assert [(r["rank"], r["sum"]) for r in second] == [(rank, 10.0) for rank in range(4)]
    log = _log(root, "requeue")
    assert "workers exited with status 75" in log and "requeueing job" in log
    assert "(restart 1) starts" in log
