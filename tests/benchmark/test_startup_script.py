"""bench/startup.py at tiny size: the first-done runs, their RSS readings and the reruns of a finished run (local
and on the S3 server) all work, so the script cannot rot between the runs that give bench/results numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.runs import REPO


@pytest.mark.slow
def test_startup_bench_runs_at_tiny_size(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "startup.py"), "--rows", "40", "--rerun-rows", "40",
         "--work", str(tmp_path)], env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s.*?(\d+) / (\d+)", result.stdout, re.MULTILINE)
    assert [int(row[0]) for row in rows] == [10, 40]  # the baseline and the one size
    assert all(float(seconds) > 0 and int(a) > 100 and int(b) > 100 for _, seconds, a, b in rows)  # two ranks' RSS
    assert "local: exit 0" in result.stdout and "S3 (moto_server): exit 0" in result.stdout
    assert "'done': 40" in result.stdout
