"""The example sbatch scripts: the rendered ones are what `gen submit` prints today, all are valid bash, and none
defines a SLURM_* or SBATCH_* variable (srun and sbatch would read it as an option)."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "slurm"


def _maker():
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _maker()


@pytest.mark.parametrize("name", sorted(MAKER.EXAMPLES))
def test_rendered_examples_are_current(name):
    assert (EXAMPLES / name).read_text() == MAKER.render(name), (
        f"examples/slurm/{name} is stale: run .venv/bin/python examples/slurm/make_examples.py and review the diff")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.sbatch")), ids=lambda p: p.name)
def test_examples_are_valid_bash_without_slurm_variables(path):
    text = path.read_text()
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert not re.search(r"^\s*(export\s+)?(SLURM|SBATCH)_\w*=", text, re.M)
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    first_command = next(i for i, line in enumerate(text.splitlines()[1:], 1) if line and not line.startswith("#"))
    assert all(text.splitlines().index(line) < first_command for line in header)  # sbatch stops at the first command


def test_nightly_bench_runs_gen_bench_against_last_night():
    text = (EXAMPLES / "nightly-bench.sbatch").read_text()
    assert 'gen bench --suite gpu --out "$reports/$today" "${baseline[@]}"' in text
    assert 'baseline=(--baseline "$reports/$yesterday")' in text
