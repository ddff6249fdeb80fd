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
    root = tmp_path_factory.mktemp("bench")
    out, cache = str(root / "report"), str(root / "cache" / "bench")
    result = run_cli("bench", "--suite", "tiny", "--out", out, "--model-cache", cache)
    return TinyReport(out=out, model_cache=cache, genbatch_cache=str(root / "cache"), exit_code=result.returncode,
                      output=result.stdout + result.stderr)


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
