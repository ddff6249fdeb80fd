"""The run every report test looks at, made once per session: `gen run --report` of a small manifest.

    report_run (session)   .manifest, .out (the run folder), .result (the `gen run` CliResult)

Its rows: an image (tiny-flux), a video (tiny-wan), a job that fails (a guidance scale that overflows the
latents to inf) and a row the manifest check rejects (a width that is not a multiple of 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.runs import CliResult, run_cli, write_manifest

ROWS = [
    {"id": "owl", "prompt": 'an owl at <night> & "day"', "model": "tiny-flux", "num_inference_steps": 2},
    {"id": "fox #1", "prompt": "a fox running through snow", "model": "tiny-wan", "num_inference_steps": 2},
    {"id": "explodes", "prompt": "x", "model": "tiny-wan", "guidance_scale": 1e38, "num_inference_steps": 2},
    {"id": "bad-size", "prompt": "a tree", "model": "tiny-flux", "width": 60},
]


@dataclass(kw_only=True, slots=True)
class ReportRun:
    manifest: str
    out: Path
    result: CliResult

    @property
    def report(self) -> Path:
        return self.out / "report"


@pytest.fixture(scope="session")
def report_run(tmp_path_factory) -> ReportRun:
    root = tmp_path_factory.mktemp("report-run")
    manifest = write_manifest(str(root / "manifest.parquet"), ROWS)
    out = root / "out"
    result = run_cli("run", manifest, "--out", str(out), "--report")
    return ReportRun(manifest=manifest, out=out, result=result)
