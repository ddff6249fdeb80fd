"""Start-up at scale: the job list reaches every rank as one Arrow buffer, and a run of a 20k-row manifest
does exactly the jobs of its share that have no done marker, each once, in the order the JobSpec rules give."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from genbatch.io import RunStore
from genbatch.io.markers import done_marker
from genbatch.jobs.schedule import select_share
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs
from genbatch.models import resolve_model
from tests.support.distributed import run_on_ranks
from tests.support.runs import run_cli_on_ranks

ROWS = 20_000
RUN = ["--model", "tiny-flux", "--width", "32", "--height", "32", "--steps", "1"]


def _manifest(path) -> str:
    index = np.arange(ROWS)
    table = pa.table({
        "id": [f"job-{i:05d}" for i in range(ROWS)],
        "prompt": [f"a paper boat, take {i}" if i % 997 else "" for i in range(ROWS)],  # 21 rows rejected
        "width": pa.array(np.where(index % 5 == 0, 64, 32)),  # two costs: the order is not the row order
        "category": [f"c{i % 3}" for i in range(ROWS)],
    })
    pq.write_table(table, path, row_group_size=4096)
    return str(path)


def test_a_20k_row_run_does_only_its_shares_undone_jobs(tmp_path):
    manifest = _manifest(tmp_path / "m.parquet")
    out = tmp_path / "out"
    share = select_share(list(read_jobs(manifest, overrides=JobOverrides(model="tiny-flux", width=32, height=32,
                                                                          num_inference_steps=1)).jobs), 1, 2,
                         resolve_model)
    todo = [share[k].id for k in (0, 1, 2, len(share) // 2, len(share) - 1)]
    store = RunStore(str(out))
    (out / "done").mkdir(parents=True)
    for job in share:  # a finished run's markers, but for `todo`
        if job.id not in todo:
            body = done_marker({"id": job.id}, output_uri="-", output_bytes=0, output_sha256="", token="t",
                               attempt="earlier")
            (out / "done" / f"{job.id}.json").write_bytes(body)

    finished = run_cli_on_ranks(2, "run", manifest, "--out", str(out), *RUN, "--share", "1/2", "-q")
    assert finished.returncode == 1, finished.stderr  # every valid job done; the 21 rejected rows are not
    assert "Traceback" not in finished.stderr, finished.stderr
    outputs = sorted(name.removesuffix(".png") for name in store.objects.list_names(store.layout.join("outputs")))
    assert outputs == sorted(todo)  # each undone job once; none of the other share, none done before
    records = {job_id: store.read_done(job_id) for job_id in todo}
    assert {record["attempt"] for record in records.values()} != {"earlier"}
    assert {records[job_id]["rank"] for job_id in todo} == {0, 1}  # both groups took jobs
    assert len(store.done_ids()) == len(share)


def _share_jobs(rank: int, world_size: int, manifest: str):
    import torch

    from genbatch.parallel.context import build_context
    from genbatch.parallel.dims import ParallelDims
    from genbatch.runner.world import World

    import genbatch.jobs.table

    genbatch.jobs.table.IPC_ROWS = 4096  # the table travels in several pieces
    world = World(ctx=build_context(ParallelDims.infer(world_size), torch.device("cpu")), dtype=torch.float32,
                  owns_process_group=False)

    def compute(keep_every):
        jobs = read_jobs(manifest, overrides=JobOverrides(model="tiny-flux")).jobs
        return jobs.take(np.arange(len(jobs))[::-keep_every]), {"told": rank}, f"rank {rank}'s own"

    shared = []
    for keep_every in (1, 3):  # most jobs (the whole table travels) and a third (only those travel)
        jobs, value, own = world.shared_table(lambda: compute(keep_every))  # noqa: B023 - called at once
        shared.append(([job.record() for job in jobs], value, own))
    return shared


def test_shared_table_gives_every_rank_the_same_jobs_and_rank_0_its_own_value(tmp_path):
    manifest = _manifest(tmp_path / "m.parquet")
    expected = read_jobs(manifest, overrides=JobOverrides(model="tiny-flux")).jobs
    results = run_on_ranks(_share_jobs, world_size=2, args=(manifest,))
    for case, keep_every in enumerate((1, 3)):
        wanted = [job.record() for job in expected.take(np.arange(len(expected))[::-keep_every])]
        assert [results[rank][case][1] for rank in (0, 1)] == [{"told": 0}, {"told": 0}]
        assert [results[rank][case][2] for rank in (0, 1)] == ["rank 0's own", None]
        assert results[0][case][0] == results[1][case][0] == wanted
