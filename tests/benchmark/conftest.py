"""One real tiny-suite report (both of its layouts), shared by the tests of this folder.

    tiny_report (session)  TinyReport: the OUT of `gen bench --suite tiny` (single + ulysses2), its exit status
                           and output, and the model cache the tests share
    slowed_baseline        a function: a copy of that report whose timing seconds are scaled, as a baseline
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.support.runs import run_cli


@dataclass(kw_only=True, slots=True)
class TinyReport:
    out: str
    """The report folder."""
    model_cache: str
    """The model cache the run built tiny-wan into (reused by later runs): `$GENBATCH_CACHE/bench`."""
    genbatch_cache: str
    """A GENBATCH_CACHE value whose benchmark models are that cache."""
    exit_code: int
    output: str
    """What `gen bench` printed (progress on stderr, nothing on stdout)."""


@pytest.fixture(scope="session")
def tiny_report(tmp_path_factory) -> TinyReport:
    """Made once per session: under pytest-xdist the first worker runs it and the others read it from the
    session's shared temporary folder (its lock held while it runs)."""
    import fcntl
    import json

    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "bench"  # the session's folder, above each worker's
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("bench")
    out, cache = str(root / "report"), str(root / "cache" / "bench")
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = root / "made.json"
        if not made.exists():
            result = run_cli("bench", "--suite", "tiny", "--out", out, "--model-cache", cache)
            made.write_text(json.dumps({"exit_code": result.returncode, "output": result.stdout + result.stderr}))
        record = json.loads(made.read_text())
    return TinyReport(out=out, model_cache=cache, genbatch_cache=str(root / "cache"), exit_code=record["exit_code"],
                      output=record["output"])


def scaled_copy(report: str, destination: str, factor: float, byte_factor: float = 1.0) -> str:
    """A baseline made from `report`: every timing row's seconds (and start offset) times `factor`, bytes
    times `byte_factor`. factor < 1: the baseline was faster than `report`."""
    os.makedirs(destination, exist_ok=True)
    shutil.copy(os.path.join(report, "summary.json"), destination)
    table = pq.read_table(os.path.join(report, "timings.parquet"))
    first = pc.min(table["start"]).as_py()
    columns = {
        "seconds": pc.multiply(table["seconds"], factor),
        "start": pc.add(pc.multiply(pc.subtract(table["start"], first), factor), first),
    }
    for name in table.column_names:
        if name.startswith("bytes_"):
            columns[name] = pc.cast(pc.multiply(table[name], byte_factor), table[name].type, safe=False)
    for name, column in columns.items():
        table = table.set_column(table.column_names.index(name), name, column)
    pq.write_table(table, os.path.join(destination, "timings.parquet"))
    return destination
