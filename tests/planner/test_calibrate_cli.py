"""`gen plan --calibrate` on real run folders (tiny-wan on this CPU, one process and Ulysses over two), and
`gen plan --profile` changing the ranking's estimates; neither imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from genbatch.jobs.exit_codes import USAGE
from tests.support.runs import REPO, run_cli, run_cli_on_ranks, write_manifest

STEPS = 4
ROWS = [
    {"id": "small", "prompt": "a fox in snow", "model": "tiny-wan", "num_inference_steps": STEPS},
    {"id": "large", "prompt": "an owl at night", "model": "tiny-wan", "num_inference_steps": STEPS,
     "width": 96, "height": 64},
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[str, str]:
    """OUT folders of a one-process run and a two-rank Ulysses run of the same two jobs."""
    root = tmp_path_factory.mktemp("calibrate")
    manifest = write_manifest(str(root / "m.parquet"), ROWS)
    single, ulysses = str(root / "single"), str(root / "ulysses2")
    first = run_cli("run", manifest, "--out", single)
    second = run_cli_on_ranks(2, "run", manifest, "--out", ulysses, "--ulysses", "2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    return single, ulysses


def test_calibrate_fits_writes_and_prints_the_profile(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    result = run_cli("plan", "--calibrate", runs[0], "--calibrate", runs[1])
    assert result.returncode == 0, result.stderr
    path = tmp_path / "config" / "genbatch" / "profiles" / "cpu-tiny-wan.json"
    profile = json.loads(path.read_text())
    used = 2 * 2 * (STEPS - 1)  # two runs, two jobs, every step but the first
    assert profile["device"] == "cpu" and profile["fit"]["steps"] == used and profile["fit"]["jobs"] == 4
    assert profile["gemm_tflops"] > 0 and sorted(profile["fit"]["runs"]) == sorted(runs)
    measured = {**profile["bandwidth_gbs"], **profile["latency_s"], **profile["fit"]["held"]}
    assert any("gloo/all_to_all" in key for key in measured)  # Ulysses' bytes: fitted, or held and said so
    assert f"from {used} steps (the median step of each of 4 jobs) -> {path}" in result.stdout
    for text in ("gemm_tflops", "layer_overhead_s", "core_sharing", "gloo/all_to_all", "residuals", "ulysses2 96x64"):
        assert text in result.stdout


def test_profile_changes_the_estimates_and_is_named_in_the_json(runs, tmp_path):
    path = str(tmp_path / "lab.json")
    assert run_cli("plan", "--calibrate", runs[0], "--calibrate", runs[1], "--profile-out", path).returncode == 0
    published = json.loads(run_cli("plan", "-m", "tiny-wan", "-g", "2", "--json").stdout)
    calibrated = json.loads(run_cli("plan", "-m", "tiny-wan", "-g", "2", "--json", "--profile", path).stdout)
    assert published["profile"] is None and calibrated["profile"]["name"] == "lab"
    assert calibrated["cluster"]["gpu"] == "cpu"  # a CPU profile plans ranks on that CPU
    steps = {layout["layout"]: layout["seconds_per_step"] for layout in published["layouts"]}
    for layout in calibrated["layouts"]:
        assert layout["seconds_per_step"] != pytest.approx(steps[layout["layout"]], rel=0.5)
        assert layout["explain"]["profile"] == "lab"
        assert layout["explain"]["parameters"]["gemm_tflops"]["source"] == "profile lab"
    # the residuals are reported (their size depends on this machine's load: tiny steps of a few ms)
    fitted = json.loads(open(path).read())["fit"]
    assert 0 <= fitted["rms_relative_residual"] <= fitted["max_relative_residual"]


def test_errors_name_the_folder_and_the_file(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("plan", "--calibrate", str(empty))
    assert result.returncode == USAGE and "has no step timings" in result.stderr
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    result = run_cli("plan", "-m", "flux.1-dev", "-g", "2", "--profile", str(other))
    assert result.returncode == USAGE and "is not a genbatch profile" in result.stderr
    result = run_cli("plan", "--profile", str(other))
    assert result.returncode == USAGE


def test_plan_and_calibrate_do_not_import_torch(runs, tmp_path):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from genbatch.cli import main\n"
        f"args = ['plan', '--calibrate', {runs[1]!r}, '--profile-out', {str(tmp_path / 'p.json')!r},"
        " '-m', 'flux.1-dev', '-g', '4']\n"
        "result = CliRunner().invoke(main, args)\n"
        "assert result.exit_code == 0, result.output\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_run_layout_auto_plans_with_the_profile_and_submit_carries_its_path(runs, tmp_path):
    from genbatch.planner.profile import load_profile
    from genbatch.planner.rank import plan

    path = str(tmp_path / "lab.json")
    assert run_cli("plan", "--calibrate", runs[0], "--calibrate", runs[1], "--profile-out", path).returncode == 0
    expected = plan("tiny-wan", 2, profile=load_profile(path)).best.layout
    manifest = write_manifest(str(tmp_path / "m.parquet"), ROWS[:1])
    out = tmp_path / "auto"
    done = run_cli_on_ranks(2, "run", manifest, "--out", str(out), "--model", "tiny-wan", "--layout", "auto",
                            "--profile", path)
    assert done.returncode == 0, done.stderr
    assert f"picked {expected.describe()} on 2 x cpu with profile lab" in done.stderr
    assert json.loads((out / "run.json").read_text())["layout"] == expected.name
    refused = run_cli("run", manifest, "--out", str(tmp_path / "manual"), "--profile", path)
    assert refused.returncode == USAGE and "add --layout auto" in refused.stderr
    script = run_cli("submit", manifest, "--out", str(tmp_path / "queued"), "--nodes", "1", "--gpus-per-node", "2",
                     "--dry-run", "--layout", "auto", "--profile", "./" + os.path.relpath(path))
    assert script.returncode == 0, script.stderr
    assert f"--profile {path}" in script.stdout  # the nodes read the file by its absolute path
    missing = run_cli("submit", manifest, "--out", str(tmp_path / "q2"), "--nodes", "1", "--gpus-per-node", "2",
                      "--dry-run", "--layout", "auto",
                      "--profile", str(tmp_path / "none.json"))
    assert missing.returncode != 0 and "no profile" in missing.stderr
