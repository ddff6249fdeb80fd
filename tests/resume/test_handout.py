"""Dynamic hand-out in `gen run` on two ranks (two dp groups): the manifest is split by work, not by count. One
long job and several short ones: the group that takes the long job (largest first) does fewer jobs while the
other works through the short ones; every job is done once, by one group."""

from __future__ import annotations

from collections import Counter

from genbatch.io import RunStore
from tests.support.runs import run_cli_on_ranks, write_manifest

SHORT = 6
ROWS = [
    {"id": f"short-{index}", "prompt": f"a kite over a beach, take {index}", "num_inference_steps": 2}
    for index in range(SHORT)
] + [{"id": "long", "prompt": "a glacier calving into the sea", "num_inference_steps": 100,
       "num_frames": 33, "width": 160, "height": 96}]  # ~9x the tokens per step, 50x the steps


def test_two_groups_split_a_skewed_manifest_by_work(tmp_path):
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS)
    out = tmp_path / "out"
    finished = run_cli_on_ranks(2, "run", manifest, "--out", str(out), "-q", "--model", "tiny-wan")
    assert finished.returncode == 0, finished.stderr

    store = RunStore(str(out))
    assert store.done_ids() == {row["id"] for row in ROWS}
    ranks = {job_id: store.read_done(job_id)["rank"] for job_id in store.done_ids()}
    jobs_per_group = Counter(ranks.values())
    assert set(jobs_per_group) == {0, 1}  # rank r leads dp group r
    long_group = ranks["long"]
    assert jobs_per_group[long_group] < jobs_per_group[1 - long_group], jobs_per_group
    assert jobs_per_group[long_group] <= 2, jobs_per_group  # a static split would give it 3 or 4
    assert len(store.objects.list_names(store.layout.join("outputs"))) == len(ROWS)
    # the layout by its one name, in run.json and on every timing row of both ranks
    assert store.read_run_info()["layout"] == "dp2"
    timings = store.read_timings()
    assert set(timings.column("layout").to_pylist()) == {"dp2"} and set(timings.column("rank").to_pylist()) == {0, 1}
