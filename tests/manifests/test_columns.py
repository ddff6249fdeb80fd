"""The column-wise checks give exactly what the row-by-row rules give: the same jobs, the same rejections (row,
id, column, reason, model, extras, in order), and the same hand-out order and shares, on manifests with every
kind of bad row, odd Arrow types, duplicates across batches and run-level options that are themselves bad."""

import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genbatch.jobs.lora import LoraRef
from genbatch.jobs.media import manifest_base
from genbatch.jobs.schedule import OrderKeys, hand_out_order, hand_out_positions, select_share, share_positions
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import ManifestReader, read_jobs
from genbatch.manifests.columns import WHITESPACE
from genbatch.models import resolve_model

ROWS = 3000
POOLS = {
    "id": ["", "  ", None, "a/b", "..", ".", "tab\there", "x" * 201, "é" * 101, "é" * 60, "\u3000", "back\\slash"],
    "prompt": ["a cat", "a cat", "a cat", "", "  ", None, "\u2003", "ok\n", "\x1c"],
    "negative_prompt": [None, "blurry"],
    "model": [None, None, "tiny-wan", "tiny-flux", "tiny-sd3", "", "  ", "no-such-model"],
    "width": [None, None, 64, 32, 0, -16, 100, 40],
    "height": [None, None, 48, 64, 0, 40],
    "num_frames": [None, None, 9, 5, 10, -3, 0],
    "num_inference_steps": [None, None, 1, 3, 0, -2],
    "guidance_scale": [None, None, 5.0, 1.0, 0.0, -0.5, float("nan"), float("inf"), -float("inf")],
    "seed": [None, None, 1, 7, 2**63, 2**64 - 1],
    "fps": [None, None, 8, 0, -1],
    "cache": [None, None, None, "none", "fbc:0.08", "FBC:0.080", "taylorseer:2", "teacache:-1", "fbc:-1", "fbc",
              "taylorseer:0", "lru"],
}
MEDIA_POOLS = {  # drawn apart (their own generator), so the other columns' draws stay as they were
    "image": [None] * 90 + ["a.png", "frames/../b.png", "/abs/c.png", "s3://bucket/d.png", "", " "],
    "last_image": [None] * 120 + ["z.png", ""],
}
LORA_POOL = [None] * 200 + [[], [{"uri": "org/style"}], [{"uri": "./loras/a.safetensors", "scale": 0.5}],
                            [{"uri": "org/a"}, {"uri": "org/b", "scale": 2.0, "weight_name": "b.safetensors"}],
                            [{"uri": "loras/x.bin"}], [{"uri": ""}], [{"uri": "org/c", "scale": float("nan")}]]
"""The `lora` column's values, drawn apart too: good sets, none, and three kinds of bad entry."""
OUTPUTS_POOL = [None] * 16 + [1, 2, 2, 3, 3, 0, -1, 1001]
"""`num_outputs`, drawn apart: one job, several (some rows take ids others derive), bad counts."""
AUDIO_POOL = [None, True, False]
"""`audio`, drawn apart: on a silent model's row any value is refused, on a sound model's (LTX-2) it is kept."""
FLOAT_OUTPUTS = [2.0, 2.5, float("nan")]
"""What a float `num_outputs` column (pandas' integers with nulls) adds."""
LORA_TYPE = pa.list_(pa.struct([("uri", pa.string()), ("scale", pa.float64()), ("weight_name", pa.string())]))
PLAIN = {"num_outputs": pa.int64(), "seed": pa.uint64(), "width": pa.int64(), "height": pa.int64(), "num_frames": pa.int64(),
         "num_inference_steps": pa.int64(), "fps": pa.int64(), "guidance_scale": pa.float64()}
ODD = {"num_outputs": pa.float64(), "seed": pa.uint64(), "width": pa.int8(), "height": pa.int16(), "num_frames": pa.int32(),
       "num_inference_steps": pa.int64(), "fps": pa.null(), "guidance_scale": pa.float32()}


def _manifest(path, types, drop=()) -> str:
    rng = np.random.default_rng(7)
    columns = {}
    for name, pool in POOLS.items():
        picks = rng.integers(0, len(pool), ROWS)
        columns[name] = [pool[k] if rng.random() < 0.3 else pool[k] for k in picks]
    # mostly good rows: unique ids, some reused (duplicates, also across batches), some bad
    ids = [f"job-{i}" for i in range(ROWS)]
    for i in rng.integers(0, ROWS, 300):
        ids[i] = ids[int(rng.integers(0, ROWS))]
    for i in rng.integers(0, ROWS, 60):
        ids[i] = POOLS["id"][int(rng.integers(0, len(POOLS["id"])))]
    outputs_rng = np.random.default_rng(17)
    for i in outputs_rng.integers(0, ROWS, 400):  # ids that other rows' num_outputs derive, ids too long to derive
        ids[i] = f"job-{int(outputs_rng.integers(0, ROWS))}-{int(outputs_rng.integers(0, 3))}"
    for i in outputs_rng.integers(0, ROWS, 10):
        ids[i] = "y" * 199
    for i in outputs_rng.integers(0, ROWS, 100):
        columns["seed"][i] = 2**63 - 1
    columns["id"] = ids
    pool = OUTPUTS_POOL + (FLOAT_OUTPUTS if types.get("num_outputs") == pa.float64() else [])
    columns["num_outputs"] = [pool[k] for k in outputs_rng.integers(0, len(pool), ROWS)]
    media_rng = np.random.default_rng(11)
    for name, pool in MEDIA_POOLS.items():
        columns[name] = [pool[k] for k in media_rng.integers(0, len(pool), ROWS)]
    lora_rng = np.random.default_rng(13)
    columns["lora"] = [LORA_POOL[k] for k in lora_rng.integers(0, len(LORA_POOL), ROWS)]
    for index, row in enumerate(media_rng.choice(ROWS, ROWS // 20, replace=False).tolist()):
        columns["model"][row] = ("tiny-wan-i2v", "tiny-wan-flf2v")[index % 2]  # image-conditioned models
    audio_rng = np.random.default_rng(19)
    columns["audio"] = [None] * ROWS
    no_cache = np.flatnonzero([value is None for value in columns["cache"]])  # the cache modes' rows stay as drawn
    for index, row in enumerate(audio_rng.choice(no_cache, ROWS // 20, replace=False).tolist()):
        if index % 4:
            columns["model"][row] = "tiny-ltx2"  # a model that makes sound
        columns["audio"][row] = AUDIO_POOL[index % 3]  # and a quarter of the rows on other models
    for name in ("width", "height", "num_frames", "num_inference_steps", "guidance_scale", "fps"):
        good = rng.random(ROWS) < 0.7  # most rows keep their null (the run's or the model's value)
        columns[name] = [None if keep else value for keep, value in zip(good, columns[name], strict=True)]
    arrays = {}
    for name, values in columns.items():
        if name in drop:
            continue
        kind = LORA_TYPE if name == "lora" else pa.bool_() if name == "audio" else types.get(name, pa.string())
        arrays[name] = pa.nulls(ROWS, kind) if kind == pa.null() else pa.array(values, kind)
    if types is ODD:
        arrays["id"] = arrays["id"].dictionary_encode()
        arrays["prompt"] = arrays["prompt"].cast(pa.large_string())
    arrays["category"] = pa.array([f"c{i % 5}" if i % 7 else None for i in range(ROWS)])
    arrays["score"] = pa.array(np.arange(ROWS) % 300, pa.int16())
    if types is ODD:
        arrays["category"] = arrays["category"].dictionary_encode()
    pq.write_table(pa.table(arrays), path, row_group_size=1100)
    return str(path)


def _reference(url, overrides, batch_rows):
    """The row-by-row rules (`tests/support/row_rules.py`) on each row's Python values."""
    from tests.support.row_rules import RowRules

    jobs, rejected = [], []
    with ManifestReader(url, batch_rows=batch_rows) as reader:
        checker = RowRules(overrides=overrides, extra_columns=reader.schema.extra_columns,
                             media_base=manifest_base(url))
        for first, columns in reader.batches():
            for outcome in checker.check_batch(first, columns):
                (jobs.extend if isinstance(outcome, tuple) else rejected.extend)(outcome)
    return jobs, rejected


@pytest.mark.parametrize(
    ("types", "drop", "overrides"),
    [
        (PLAIN, (), JobOverrides(model="tiny-wan")),
        (ODD, (), JobOverrides(model="tiny-flux", width=72, num_inference_steps=2, cache="taylorseer:3")),
        (PLAIN, ("negative_prompt", "seed", "fps"), JobOverrides(model="tiny-wan", height=40, guidance_scale=0.5)),
        (ODD, ("model",), JobOverrides(model="tiny-sd3", num_frames=5, lora=(LoraRef("org/run-level", 0.3),))),
        (PLAIN, (), JobOverrides(model="no-such-model")),
    ],
    ids=["plain", "odd-types", "missing-columns", "no-model-column", "bad-run-model"],
)
def test_column_checks_equal_the_row_rules(tmp_path, types, drop, overrides):
    url = _manifest(tmp_path / "m.parquet", types, drop)
    expected_jobs, expected_rejected = _reference(url, overrides, batch_rows=512)
    result = read_jobs(url, overrides=overrides, batch_rows=512, check_media=False)  # the row rules only
    assert list(result.jobs) == expected_jobs
    assert [result.jobs[i] for i in (0, -1)] == [expected_jobs[0], expected_jobs[-1]] if expected_jobs else True
    assert result.rejected == expected_rejected
    # every kind of problem is there (the test covers what it claims)
    columns = {rejection.column for rejection in result.rejected}
    assert {"id", "prompt", "width", "lora"} <= columns and len(result.rejected_rows) < ROWS
    assert "audio" in columns  # a silent model's row that says `audio`
    sound = {job.audio for job in result.jobs if job.model == "tiny-ltx2"}
    assert sound == ({True, False} if "model" not in drop and overrides.width is None else set())
    assert not any(job.audio for job in result.jobs if job.model != "tiny-ltx2")
    sets = {job.lora for job in result.jobs}
    assert ((LoraRef("org/run-level", 0.3),) in sets) == bool(overrides.lora)  # null rows take --lora
    if "cache" not in drop:
        assert "cache" in columns
        modes = {job.cache for job in result.jobs}
        assert modes == {"none", "fbc:0.08", "taylorseer:2", overrides.cache or "none"}  # canonical; nulls: --cache
    if types is PLAIN and overrides.model == "tiny-wan" and not drop:
        reasons = " ".join(rejection.reason for rejection in result.rejected)
        for part in ("duplicate id", "cannot name an output file", "bytes long", "empty prompt", "int64",
                     "not a preset", "empty model name", "video models only", "must be positive", "is negative",
                     "not a finite number", "not a multiple of", "not of the form", "is not a cache mode",
                     "the teacache threshold", "the fbc threshold", "the taylorseer interval",
                     "is a pickle file", "has no uri", "has scale nan", "already a job id of row",
                     "already the id of", "at least one", "more than the 1000", "makes ids of up to", "one seed per output"):
            assert part in reasons, part
        assert len(result.jobs) > len({job.row for job in result.jobs})  # rows of several outputs
        assert "num_outputs" in columns
        assert () in sets and any(sets - {()})  # rows with adapters, rows with none
    if types is ODD:
        assert "is not a whole number" in " ".join(rejection.reason for rejection in result.rejected)

    # the hand-out order and every share, from the columns, equal those of the JobSpecs
    keys = OrderKeys(result.jobs, resolve_model)
    assert list(result.jobs.take(hand_out_positions(keys))) == hand_out_order(expected_jobs, resolve_model)
    for index in range(3):
        assert list(result.jobs.take(share_positions(keys, index, 3))) == select_share(expected_jobs, index, 3, resolve_model)
    share = share_positions(keys, 1, 3)
    assert list(result.jobs.take(hand_out_positions(keys, share))) == hand_out_order(select_share(expected_jobs, 1, 3, resolve_model), resolve_model)


def test_the_whitespace_class_is_pythons():
    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


def test_a_job_table_crosses_processes_in_pieces(tmp_path):
    url = _manifest(tmp_path / "m.parquet", ODD)  # a dictionary column too
    jobs = read_jobs(url, overrides=JobOverrides(model="tiny-wan")).jobs
    view = jobs.take(np.arange(len(jobs))[::-7])
    from genbatch.jobs.table import JobTable

    import genbatch.jobs.table as table_module

    table_module.IPC_ROWS, rows = 50, table_module.IPC_ROWS  # several pieces
    try:
        pieces = [memoryview(view.ipc_piece(index)) for index in range(view.ipc_pieces())]
    finally:
        table_module.IPC_ROWS = rows
    assert len(pieces) == -(-jobs.table.num_rows // 50) > 1
    copy = JobTable.from_ipc(pieces, view.order)
    assert list(copy) == list(view) and copy.extra_columns == ("category", "score")
