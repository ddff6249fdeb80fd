"""The sbatch script is a pure function of SbatchSpec: golden files, shell syntax, validation, gen submit.

Regenerate the golden files after an intended change with:
    GENBATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/slurm/test_sbatch.py
and review the diff.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.slurm.sbatch import SbatchSpec, render_sbatch

GOLDEN = Path(__file__).parent / "golden"
PY = "/opt/genbatch/bin/python"
RUN = (PY, "-m", "genbatch", "run")

SPECS = {
    "multinode_gpu": SbatchSpec(
        command=(*RUN, "s3://prompts/batch.parquet", "--out", "s3://media/run-7", "--ulysses", "4", "--cfg", "2",
                 "--model", "/models/Wan2.1-T2V-14B-Diffusers", "--storage-option", "endpoint_url=https://s3.example"),
        python=PY, nodes=4, procs_per_node=8, gpus_per_node=8, cpus_per_task=96, time="04:00:00",
        partition="gpu", account="video-gen", log_dir="/home/ana/logs/",
    ),
    "array_cpu": SbatchSpec(
        command=(*RUN, "/data/m.parquet", "--out", "/data/run", "--backend", "gloo", "--model", "tiny-wan"),
        python=PY, nodes=1, procs_per_node=2, array=3, signal_grace_s=30, job_name="tiny-array",
    ),
    "no_requeue_extras": SbatchSpec(
        command=(*RUN, "/data/m.parquet", "--out", "/data/run dir", "--dp", "2", "--fsdp"),
        python=PY, nodes=2, procs_per_node=4, gpus_per_node=4, signal_grace_s=0, requeue=False,
        extra_sbatch=("--qos=low", "--exclusive", "--mem=0"),
        setup=("module load cuda/12.4", "export HF_HUB_OFFLINE=1"), job_name="nightly",
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_render_matches_golden(name):
    text = render_sbatch(SPECS[name])
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("GENBATCH_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with GENBATCH_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{name}: rendering changed; if intended, regenerate (see module docstring)"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_rendered_script_is_valid_bash_and_defines_no_slurm_variables(name):
    text = render_sbatch(SPECS[name])
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert not re.search(r"^\s*(export\s+)?(SLURM|SBATCH)_\w*=", text, re.M)
    assert text.startswith("#!/bin/bash\n#SBATCH ")


def test_header_follows_the_spec():
    header = SPECS["multinode_gpu"].header()
    assert header[:4] == ["#SBATCH --job-name=genbatch", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --gpus-per-node=8"]
    assert "#SBATCH --output=/home/ana/logs/%x-%j.out" in header
    array_header = SPECS["array_cpu"].header()
    assert "#SBATCH --array=0-2" in array_header and "#SBATCH --output=slurm-logs/%x-%A_%a.out" in array_header
    assert not any("gpus" in line for line in array_header)
    plain = SPECS["no_requeue_extras"].header()
    assert "#SBATCH --no-requeue" in plain and not any("--signal" in line for line in plain)
    assert plain[-3:] == ["#SBATCH --qos=low", "#SBATCH --exclusive", "#SBATCH --mem=0"]


def test_render_is_pure():
    spec = SPECS["multinode_gpu"]
    assert render_sbatch(spec) == render_sbatch(spec)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nodes": 0}, "nodes=0"),
        ({"procs_per_node": 0}, "procs_per_node=0"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"array": 0}, "array=0"),
        ({"time": "4h"}, "time='4h'"),
        ({"signal_grace_s": -5}, "signal_grace_s=-5"),
        ({"job_name": "my job"}, "job_name='my job'"),
        ({"extra_sbatch": ("qos=low",)}, "'qos=low'"),
        ({"extra_sbatch": ("--qos low",)}, "'--qos low'"),
        ({"setup": ("a\nb",)}, "newline"),
        ({"command": ()}, "command"),
    ],
)
def test_invalid_specs_name_the_value_and_the_fix(changes, message):
    fields = {"command": RUN, "python": PY, **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        SbatchSpec(**fields)


def test_time_formats_slurm_accepts():
    for value in ("30", "30:00", "04:00:00", "1-00", "1-12:00", "2-00:00:00"):
        SbatchSpec(command=RUN, python=PY, time=value)


# -- gen submit ---------------------------------------------------------------------------------------------


def _submit(*args):
    return CliRunner().invoke(main, ["submit", *args], catch_exceptions=False)


def test_submit_dry_run_prints_the_rendered_spec(tmp_path):
    manifest, out, logs = tmp_path / "m.parquet", tmp_path / "run", tmp_path / "logs"
    result = _submit(str(manifest), "--out", str(out), "--nodes", "2", "--gpus-per-node", "0", "--procs-per-node",
                     "2", "--partition", "low", "--time", "10", "--array", "3", "--python", PY, "--log-dir",
                     str(logs), "--extra-sbatch=--exclusive", "--dp", "2", "--backend", "gloo", "--steps", "4",
                     "--dry-run")
    assert result.exit_code == 0, result.output
    expected = SbatchSpec(
        command=(*RUN, str(manifest), "--out", str(out), "--dp", "2", "--backend", "gloo", "--steps", "4"),
        python=PY, nodes=2, procs_per_node=2, gpus_per_node=0, partition="low", time="10", array=3,
        log_dir=str(logs), extra_sbatch=("--exclusive",),
    )
    assert result.output == render_sbatch(expected)
    assert not logs.exists()  # a dry run creates nothing


def test_submit_makes_local_paths_absolute_and_keeps_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _submit("m.parquet", "--out", "s3://bucket/run", "--nodes", "1", "--gpus-per-node", "4", "--python",
                     PY, "--dry-run")
    assert result.exit_code == 0, result.output
    unfolded = " ".join(result.output.replace("\\\n", " ").split())  # the long command is folded with backslashes
    assert f"{PY} -m genbatch run {tmp_path}/m.parquet --out s3://bucket/run" in unfolded
    assert "--nproc-per-node=4" in result.output and "#SBATCH --gpus-per-node=4" in result.output
    assert f"#SBATCH --output={tmp_path}/slurm-logs/%x-%j.out" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus-per-node", "0"], "--procs-per-node"),
        (["--gpus-per-node", "2", "--dpp", "2"], "gen run would refuse these options: No such option '--dpp'"),
        (["--gpus-per-node", "2", "--cfg", "3"], "gen run would refuse"),
        (["--gpus-per-node", "2", "--array", "2", "--share", "0/2"], "drop --share"),
        (["--gpus-per-node", "2", "--time", "soon"], "time='soon'"),
    ],
)
def test_submit_refuses_bad_options_before_queueing(tmp_path, args, message):
    result = CliRunner().invoke(main, ["submit", "m.parquet", "--out", str(tmp_path), "--nodes", "1", *args,
                                       "--dry-run"])
    assert result.exit_code == 2
    assert message in result.output


def test_submit_without_sbatch_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    result = CliRunner().invoke(main, ["submit", "m.parquet", "--out", str(tmp_path / "run"), "--nodes", "1",
                                       "--gpus-per-node", "1", "--log-dir", str(tmp_path / "logs")])
    assert result.exit_code == 1
    assert "sbatch is not on PATH" in result.output and "--dry-run" in result.output


def test_submit_carries_the_quantization_and_refuses_it_beside_tp(tmp_path):
    manifest, out = str(tmp_path / "m.parquet"), str(tmp_path / "run")
    common = (manifest, "--out", out, "--nodes", "1", "--gpus-per-node", "2", "--python", PY, "--dry-run")
    result = _submit(*common, "--ulysses", "2", "--quantization", "fp8", "--quantize-text-encoder")
    assert result.exit_code == 0, result.output
    assert "--quantization fp8 --quantize-text-encoder" in " ".join(result.output.replace("\\\n", " ").split())
    refused = _submit(*common, "--tp", "2", "--quantization", "int8")
    assert refused.exit_code == 2 and "--tp 2 with --quantization int8: torchao's quantized weights" in refused.output
    assert _submit(*common, "--quantization", "int4").exit_code == 2  # gen run's parser: not a choice
