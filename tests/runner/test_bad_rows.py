"""A bad row never stops a run: a manifest of good rows and bad ones (an image that is a text file, an adapter for
another architecture, an adapter that is no safetensors file, an image that does not exist) ends in one
invocation with exit 1 under one process and every multi-rank layout; each bad row is failed (or, where
validation can tell, rejected) with its row, column and reason; the good rows are done and equal one process's;
under --batch-size the bad row fails alone and its batch-mates equal their unbatched runs. A read that fails on
one rank alone fails the row on every rank, the group goes on, and a rerun does the row. The counts agree:
a duplicate id is one rejected row in the summary line, `gen status` and `gen report`; `gen status --failed`
lists exactly the failed jobs."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.models.pipeline_outputs import random_image
from tests.support.distributed import run_on_ranks
from tests.support.runs import _run_cli_rank, run_cli, write_manifest

PRESET = "tiny-qwen-image-edit"  # takes an image on every row, has a LoRA loader, CFG, and every layout
GOOD = [f"good-{index}" for index in range(3)]
FAILED = {"bad-image": "image", "alien-lora": "lora", "pickled-lora": "lora"}
REJECTED = {"missing-image": "image"}


def _alien_adapter(path) -> str:
    """A LoRA in diffusers' layout for another architecture: the names of this model's attention projections,
    with shapes no module of it has (a 32-wide model's)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    state = {}
    for block in range(2):
        key = f"transformer.transformer_blocks.{block}.attn.to_q"
        state[f"{key}.lora_A.weight"] = torch.randn(4, 32, generator=generator)
        state[f"{key}.lora_B.weight"] = torch.randn(32, 4, generator=generator)
    save_file(state, str(path))
    return str(path)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("bad-rows")
    random_image(root / "in.png", (48, 32))
    (root / "notes.png").write_text("notes for the shoot, not an image\n")
    (root / "loras").mkdir()
    _alien_adapter(root / "loras" / "alien.safetensors")
    torch.save({"weight": torch.zeros(2)}, root / "loras" / "pickled.safetensors")
    rows = [{"id": name, "prompt": f"a red boat {index}", "image": "in.png", "seed": index}
            for index, name in enumerate(GOOD)]
    rows += [{"id": "bad-image", "prompt": "a red boat", "image": "notes.png"},
             {"id": "alien-lora", "prompt": "a red boat", "image": "in.png", "lora": [{"uri": "loras/alien.safetensors"}]},
             {"id": "pickled-lora", "prompt": "a red boat", "image": "in.png",
              "lora": [{"uri": "loras/pickled.safetensors"}]},
             {"id": "missing-image", "prompt": "a red boat", "image": "gone.png"}]
    for row in rows:
        row.update(model=PRESET, num_inference_steps=2, width=48, height=32, negative_prompt="blurry")
    return write_manifest(str(root / "manifest.parquet"), rows)


def _pixels(out: str, job_id: str) -> np.ndarray:
    return np.asarray(Image.open(os.path.join(out, "outputs", f"{job_id}.png")))


@pytest.fixture(scope="module")
def one_process(manifest, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("one") / "out")
    result = run_cli("run", manifest, "--out", out, "-q")
    assert result.returncode == 1, result.stderr[-3000:]
    return out


def _check(out: str, reference: str, label: str) -> None:
    """Each bad row failed or rejected with its column and reason, each good row done and equal to one
    process's output."""
    rows = {row["id"]: row for row in pq.read_table(os.path.join(out, "results")).to_pylist()}
    assert {job_id: row["status"] for job_id, row in rows.items()} == {
        **dict.fromkeys(GOOD, "done"), **dict.fromkeys(FAILED, "failed"), **dict.fromkeys(REJECTED, "rejected")}, label
    for job_id, column in FAILED.items():
        row = rows[job_id]
        assert row["column"] == column, (label, row)
        assert row["error"].startswith(f"row {row['row']} (id {job_id}), column {column!r}: "), (label, row["error"])
    assert "not an image" in rows["bad-image"]["error"] and "notes.png" in rows["bad-image"]["error"]
    assert "is for another architecture than" in rows["alien-lora"]["error"]
    assert "not a safetensors file" in rows["pickled-lora"]["error"]
    assert "no such file" in rows["missing-image"]["error"]
    for job_id in GOOD:
        np.testing.assert_array_equal(_pixels(out, job_id), _pixels(reference, job_id), err_msg=f"{label} {job_id}")


def test_one_process_and_a_batch_of_four(one_process, manifest, tmp_path):
    _check(one_process, one_process, "one process")
    out = str(tmp_path / "batched")
    result = run_cli("run", manifest, "--out", out, "--batch-size", "4", "-q")
    assert result.returncode == 1, result.stderr[-3000:]
    _check(out, one_process, "--batch-size 4")
    # the bad image shared a batch with the good rows, and failed alone in it
    timings = pq.read_table(os.path.join(out, "timings")).to_pylist()
    sizes = {row["job_id"]: row.get("batch_size") for row in timings if row["stage"] == "denoise_step"}
    assert any(size == 3 for size in sizes.values()), sizes


def _runs(rank: int, world_size: int, runs: list[tuple[str, ...]]) -> list[int]:
    """Each `gen` command line in turn, on this rank of the pool: their exit statuses (none a crash)."""
    results = [_run_cli_rank(rank, world_size, args) for args in runs]
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr
    return [result.returncode for result in results]


LAYOUTS_2 = {"ulysses2": ("--ulysses", "2"), "tp2": ("--tp", "2"), "cfg2": ("--cfg", "2"), "pp2": ("--pp", "2"),
             "ulysses2-batch4": ("--ulysses", "2", "--batch-size", "4")}


@pytest.mark.parametrize(("world_size", "layouts"), [
    (2, LAYOUTS_2), (4, {"dp2-ulysses2": ("--dp", "2", "--ulysses", "2")})], ids=["2-ranks", "4-ranks"])
def test_every_layout_fails_the_bad_rows_alone(world_size, layouts, manifest, one_process, tmp_path):
    runs = [("run", manifest, "--out", str(tmp_path / name), *flags, "-q") for name, flags in layouts.items()]
    statuses = run_on_ranks(_runs, world_size, args=(runs,), timeout_s=120)
    # the run's status is rank 0's (the others end 0 when their part went through); never 75
    assert statuses[0] == [1] * len(runs), dict(zip(layouts, statuses[0], strict=True))
    assert all(set(codes) <= {0, 1} for codes in statuses), statuses
    for name in layouts:
        _check(str(tmp_path / name), one_process, name)


def _flaky_read_then_rerun(rank: int, world_size: int, manifest: str, out: str) -> list:
    """The run with rank 1's first image read failing (a read that timed out there alone), then its rerun."""
    from unittest import mock

    from genbatch.io.media_input import MediaReader
    from genbatch.io.retry import StorageError

    real = MediaReader._bytes
    calls = []

    def flaky(reader, url):
        calls.append(url)
        if rank == 1 and len(calls) == 1:
            raise StorageError(f"reading {url}: timed out after 120 s", url=url, transient=True)
        return real(reader, url)

    args = ("run", manifest, "--out", out, "--ulysses", "2", "-q")
    with mock.patch.object(MediaReader, "_bytes", flaky):
        first = _run_cli_rank(rank, world_size, args)
    rerun = _run_cli_rank(rank, world_size, args)
    assert "Traceback" not in first.stderr + rerun.stderr, first.stderr + rerun.stderr
    return [first.returncode, rerun.returncode]


def test_a_read_failing_on_one_rank_fails_the_row_on_all_and_a_rerun_does_it(tmp_path):
    random_image(tmp_path / "in.png", (48, 32))
    rows = [{"id": f"row-{index}", "prompt": "a red boat", "image": "in.png", "seed": index, "model": PRESET,
             "num_inference_steps": 2, "width": 48, "height": 32} for index in range(2)]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    out = str(tmp_path / "out")
    per_rank = run_on_ranks(_flaky_read_then_rerun, 2, args=(manifest, out), timeout_s=90)
    assert per_rank[0] == [1, 0] and per_rank[1] == [0, 0], per_rank
    (failure,) = [json.loads((tmp_path / "out" / "failed" / name).read_text())
                  for name in os.listdir(tmp_path / "out" / "failed")]
    error = failure["record"]["error"]
    assert "column 'image'" in error and "timed out" in error and "(on rank 1 of its group)" in error, error
    assert sorted(os.listdir(tmp_path / "out" / "done")) == ["row-0.json", "row-1.json"]


def test_gen_status_failed_lists_the_failed_jobs_in_text_and_json(one_process):
    text = run_cli("status", one_process, "--failed")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(FAILED)  # by manifest row
    assert lines[0].split()[1:5] == ["row", "3", "attempts", "1"]
    assert "column 'image':" in lines[0] and "not an image" in lines[0]
    records = json.loads(run_cli("status", one_process, "--failed", "--json").stdout)
    assert [(record["id"], record["column"], record["attempts"]) for record in records] == [
        (job_id, column, 1) for job_id, column in FAILED.items()]
    assert all(record["reason"] and "\n" not in record["reason"] for record in records)


def test_a_duplicate_id_is_one_rejected_row_in_every_count(tmp_path):
    rows = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"},
            {"id": "c", "prompt": "w", "width": 7}]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    out = str(tmp_path / "out")
    result = run_cli("run", manifest, "--out", out, "--model", "tiny-flux", "--steps", "1", "--report")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "2 done, 0 failed, 2 rejected" in result.stderr
    status = json.loads(run_cli("status", out, "--json").stdout)
    assert (status["done"], status["rejected"], status["total"]) == (2, 2, 4)
    results = pq.read_table(os.path.join(out, "results")).to_pylist()
    assert sorted((row["id"], row["row"], row["status"]) for row in results) == [
        ("a", 0, "done"), ("a", 2, "rejected"), ("b", 1, "done"), ("c", 3, "rejected")]
    index = open(os.path.join(out, "report", "index.html")).read()
    assert "rejected (2)" in index and "duplicate id, first used on row 0" in index


@pytest.mark.slow  # the real launcher and two fresh interpreters: the pool's runs above show the same outcome
@pytest.mark.processes
def test_gen_run_nproc_2_ends_with_1_and_leaves_no_process(manifest, one_process, tmp_path):
    """The real launcher and its ranks (`gen run --nproc 2 --ulysses 2`) under a subreaper, which adopts any rank
    its launcher leaves behind and ends only once the launcher and every such rank have ended: one invocation,
    exit 1, nothing left."""
    import subprocess
    import sys

    from tests.support.runs import REPO

    out = str(tmp_path / "out")
    report_read, report_write = os.pipe()
    command = [sys.executable, "-m", "genbatch", "run", manifest, "--out", out, "--nproc", "2", "--ulysses", "2", "-q"]
    reaper = subprocess.Popen([sys.executable, "-m", "tests.support.reaper", str(report_write), *command],
                              env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(report_write,))
    os.close(report_write)
    _, stderr = reaper.communicate(timeout=240)  # ends once the launcher and every process it left have ended
    with os.fdopen(report_read) as report:
        launcher, *ends = report.read().split("\n")
    statuses = {int(pid): int(status) for pid, status, _ in (line.split() for line in ends if line)}
    assert reaper.returncode == 0, stderr[-3000:]
    assert statuses[int(launcher)] == 1, (statuses, stderr[-3000:])
    assert set(statuses.values()) <= {0, 1}, statuses  # ranks the launcher left (none, normally) ended too
    _check(out, one_process, "gen run --nproc 2 --ulysses 2")
