"""`gen plan` gives a plan to act on: layouts by name, each once; fsdp on or off; each rejection reason once with
its layouts; no negative zero; the best layout's `gen run` flags, which gen run's own parser reads back as the
same layout; `--size` for the size."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.exit_codes import USAGE
from genbatch.parallel.dims import LayoutRequest, ParallelDims
from genbatch.planner import plan
from genbatch.planner.command import run_command as best_command
from genbatch.planner.constraints import LayoutConstraints


def _gen(*args: str):
    return CliRunner().invoke(main, list(args))


def _table_rows(output: str) -> list[list[str]]:
    """The ranked rows of the table: the lines after the header that start with their rank."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.split()[:2] == ["#", "layout"])
    return [line.split() for line in lines[start + 1:] if re.match(r"^\s*\d+\s", line)]


def test_the_table_names_each_layout_once_with_fsdp_on_or_off_and_no_negative_zero():
    result = _gen("plan", "-m", "wan2.1-14b", "-g", "8", "--top", "100")
    assert result.exit_code == 0, result.stderr
    header = next(line.split() for line in result.stdout.splitlines() if line.split()[:2] == ["#", "layout"])
    rows = _table_rows(result.stdout)
    names = [row[1] for row in rows]
    assert len(names) == len(set(names)) > 20
    fsdp = header.index("fsdp")
    for row in rows:
        layout = ParallelDims.parse(row[1])
        assert row[fsdp] == ("on" if layout.fsdp else "off")
        assert [int(cell) for cell in row[2:fsdp]] == list(layout.degrees().values())
        assert not layout.fsdp or layout.fsdp_size > 1  # FSDP over one rank is no layout
    assert "-0.0" not in result.stdout  # dp8's exposed communication was -2.5e-16 s


def test_each_rejection_reason_is_printed_once_with_the_layouts_it_rejects():
    result = _gen("plan", "-m", "flux.1-dev", "-g", "4")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    reason = "cfg=2 needs a model with classifier-free guidance"
    assert text.count(reason) == 1
    assert "rejected 11 layouts, for 1 reason:" in text
    listed = text[text.index(reason):].split(":\n", 1)[1]
    names = {name.strip() for name in listed.replace("\n", " ").split(",")}
    assert names == {rejection.layout.name for rejection in plan("flux.1-dev", 4).rejected}


def _run_params(args: tuple[str, ...]) -> dict:
    """gen run's parameters as its own click parser reads `args` (MANIFEST --out OUT and the flags)."""
    from genbatch.runner.cli import run_command

    with run_command.make_context("run", list(args)) as context:
        return dict(context.params)


@pytest.mark.parametrize(("model", "gpus", "options", "constraints"), [
    ("flux.1-dev", 4, {}, {}),
    ("flux.1-dev", 4, {}, {"ulysses": 2, "fsdp": True}),
    ("wan2.1-14b", 8, {"objective": "latency"}, {}),
    ("hunyuanvideo", 2, {}, {}),  # decodes tiled: the flags say so
    ("wan2.1-1.3b", 4, {"batch_size": 2}, {"cfg": 2}),
    ("wan2.1-14b", 16, {"nodes": 2}, {}),  # several nodes: gen submit
], ids=["dp4", "ulysses2-fsdp", "latency", "tiled-decode", "batch", "two-nodes"])
def test_the_best_layouts_flags_read_back_as_that_layout_by_gen_runs_parser(model, gpus, options, constraints):
    result = plan(model, gpus, constraints=LayoutConstraints(**constraints), **options)
    command = best_command(result, model)
    best = result.best
    flags = list(command.flags)
    world = gpus
    if command.command == "submit":  # gen submit passes the flags it does not know to gen run, as they are
        nodes = flags.index("--nodes")
        per_node = int(flags[flags.index("--gpus-per-node") + 1])
        assert int(flags[nodes + 1]) * per_node == gpus == result.cluster.nodes * per_node
        del flags[nodes:nodes + 4]
    else:
        assert flags[flags.index("--nproc") + 1] == str(gpus) if gpus > 1 else "--nproc" not in flags
    params = _run_params(("MANIFEST", "--out", "OUT", *flags))
    assert params["model"] == model
    assert LayoutRequest.from_flags(params).resolve(world) == best.layout
    assert params["vae_decode"] in ("auto", best.estimate.decode_mode)
    if best.estimate.decode_mode == "tiled":
        assert params["vae_decode"] == "tiled"
    assert params["batch_size"] == options.get("batch_size", 1)
    assert shlex.split(command.line()) == ["gen", *command.args]


def test_the_table_and_the_json_print_the_same_command():
    table = _gen("plan", "-m", "flux.1-dev", "-g", "4", "--ulysses", "2", "--fsdp")
    data = json.loads(_gen("plan", "-m", "flux.1-dev", "-g", "4", "--ulysses", "2", "--fsdp", "--json").stdout)
    line = "gen run MANIFEST --out OUT --model flux.1-dev --nproc 4 --ulysses 2 --fsdp"
    assert data["run"] == {"command": "run", "flags": shlex.split(line)[5:], "line": line}
    assert f"  {line}" in table.stdout.splitlines()


def test_size_shorthand_is_the_width_and_height():
    def workload(*args):
        result = _gen("plan", "-m", "wan2.1-1.3b", "-g", "2", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["workload"]

    assert workload("--size", "720p") == workload("--width", "1280", "--height", "720")
    assert workload("--size", "1024x576")["width"] == 1024
    bad = _gen("plan", "-m", "wan2.1-1.3b", "-g", "2", "--size", "big")
    assert bad.exit_code == USAGE and "480p, 540p, 720p, 1080p, or WIDTHxHEIGHT" in bad.stderr
    both = _gen("plan", "-m", "wan2.1-1.3b", "-g", "2", "--size", "720p", "--width", "640")
    assert both.exit_code == USAGE and "drop --width or --size" in both.stderr


def test_gen_run_and_validate_take_the_same_size_shorthand():
    from genbatch.manifests.cli import overrides_from_options
    from genbatch.runner.options import RunOptions

    params = _run_params(("MANIFEST", "--out", "OUT", "--size", "480p"))
    overrides = RunOptions.from_flags("MANIFEST", "OUT", params).model.overrides
    assert (overrides.width, overrides.height) == (832, 480)
    assert overrides_from_options({"size": "540p"}).height == 540
    from genbatch.runner.options import UsageError

    both = _run_params(("MANIFEST", "--out", "OUT", "--size", "480p", "--width", "640"))
    with pytest.raises(UsageError, match="drop --width or --size"):
        RunOptions.from_flags("MANIFEST", "OUT", both)
    result = _gen("validate", "no-such.parquet", "--model", "tiny-wan", "--size", "720p", "--height", "480")
    assert result.exit_code == USAGE and "--size 720p sets the width and the height; drop --height" in result.stderr
    result = _gen("validate", "no-such.parquet", "--model", "tiny-wan", "--size", "720")
    assert result.exit_code == USAGE and "not a size" in result.stderr
