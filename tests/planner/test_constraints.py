"""`gen plan` takes `gen run`'s layout flags as constraints, and names layouts in the runner's grammar."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.exit_codes import USAGE
from genbatch.parallel.axes import AXES
from genbatch.parallel.dims import ParallelDims, layout_name
from genbatch.planner import plan
from genbatch.planner.constraints import LayoutConstraints, nearest_fixes
from genbatch.planner.cli import plan_command
from genbatch.planner.layouts import enumerate_layouts
from genbatch.runner.cli import run_command


def _json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_degree_flag_ranks_only_layouts_with_that_degree_in_the_same_order():
    free = _json("-m", "flux.1-dev", "-g", "8")
    data = _json("-m", "flux.1-dev", "-g", "8", "--ulysses", "4")
    assert data["constraints"] == {"ulysses": 4} and free["constraints"] == {}
    assert data["layouts"] and all(layout["ulysses"] == 4 for layout in data["layouts"] + data["rejected"])
    assert [layout["layout"] for layout in data["layouts"]] == [
        layout["layout"] for layout in free["layouts"] if layout["ulysses"] == 4]
    assert data["best"]["layout"] == "dp2-ulysses4" and free["best"]["layout"] == "dp8"


def test_fsdp_flags_keep_sharded_or_unsharded_layouts():
    sharded = plan("wan2.1-14b", 8, constraints=LayoutConstraints(fsdp=True))
    plain = plan("wan2.1-14b", 8, constraints=LayoutConstraints(fsdp=False, cfg=2))
    assert sharded.ranked and all(  # FSDP's sub-mesh: the job group without tp and pp
        c.layout.fsdp and c.layout.group_size > 1 and c.layout.fsdp_size == c.layout.group_size // (c.layout.tp * c.layout.pp)
        for c in sharded.ranked)
    assert plain.ranked and all(not c.layout.fsdp and c.layout.cfg == 2 for c in plain.ranked)
    assert sharded.best.layout.name.endswith("-fsdp")


def test_an_unmet_constraint_names_itself_the_limit_and_the_nearest_fixes():
    result = CliRunner().invoke(main, ["plan", "-m", "flux.1-dev", "-g", "16", "--ulysses", "16"])
    assert result.exit_code == USAGE
    assert "no layout with --ulysses 16 fits flux.1-dev" in result.output
    assert "does not divide the 24 heads" in result.output
    assert "nearest that fit: --ulysses 8 | --ulysses 4" in result.output


def test_a_degree_no_factoring_has_suggests_the_neighbouring_degrees():
    with pytest.raises(ValueError, match=r"no way to factor 8 GPUs has --ulysses 3; nearest that fit: --ulysses 4 "
                                         r"\| --ulysses 2"):
        plan("flux.1-dev", 8, constraints=LayoutConstraints(ulysses=3))


def test_nearest_fixes_change_one_constraint_and_keep_the_others():
    fitting = [candidate.layout for candidate in plan("flux.1-dev", 8).ranked]
    fixes = nearest_fixes(LayoutConstraints(cfg=2, fsdp=True), fitting)
    assert fixes == ["--cfg 1 --fsdp"]  # flux has no CFG; dropping --fsdp alone does not help
    assert nearest_fixes(LayoutConstraints(dp=3), fitting) == ["--dp 4", "--dp 2"]  # nearest by ratio
    with pytest.raises(ValueError, match="--ring 0"):
        LayoutConstraints(ring=0)


def test_every_axis_can_be_constrained_and_its_layouts_run():
    result = plan("flux.1-dev", 8, gpu="l40", constraints=LayoutConstraints(pp=2))
    assert result.ranked and all(candidate.layout.pp == 2 for candidate in result.ranked)
    assert result.best.layout.pp == 2
    for candidate in result.ranked:
        candidate.layout.check()  # the runner's start-up check


def test_run_and_plan_share_one_definition_of_the_layout_flags():
    def layout_params(command):
        return {param.name: param for param in command.params if param.name in (*AXES, "fsdp")}

    run, planned = layout_params(run_command), layout_params(plan_command)
    assert list(run) == list(planned) == [*AXES, "fsdp"]
    assert [run[name].opts for name in run] == [planned[name].opts for name in planned]
    assert run["ulysses"].default == 1 and planned["ulysses"].default is None  # a constraint is unset by default
    assert run["fsdp"].secondary_opts == planned["fsdp"].secondary_opts == ["--no-fsdp"]


@pytest.mark.parametrize("gpus", [1, 8])
def test_planner_layouts_are_the_runners_parallel_dims_named_in_its_grammar(gpus):
    for layout in enumerate_layouts(gpus):
        assert type(layout) is ParallelDims
        assert layout.name == layout_name(layout.degrees(), fsdp=layout.fsdp)
        assert ParallelDims.parse(layout.name) == layout  # pp and tp layouts read back too
    assert ParallelDims(dp=2, cfg=2, ulysses=4, fsdp=True).name == "dp2-cfg2-ulysses4-fsdp"
    assert ParallelDims(pp=2, tp=2).name == "pp2-tp2" and ParallelDims().name == "single"


def test_ranked_layouts_round_trip_and_the_runner_accepts_each():
    result = plan("wan2.1-14b", 8, objective="latency")  # ranks tp and pp layouts
    assert any(candidate.layout.pp > 1 for candidate in result.ranked)
    # HunyuanVideo's transformer takes no PipeFusion stages in the runner: the planner ranks none
    assert not any(candidate.layout.pp > 1 for candidate in plan("hunyuanvideo", 8, objective="latency").ranked)
    assert any(candidate.layout.tp > 1 and candidate.layout.fsdp for candidate in result.ranked)
    for candidate in result.ranked:
        layout = candidate.layout
        assert type(layout) is ParallelDims and ParallelDims.parse(layout.name) == layout
        layout.check()


def test_gen_plan_with_layout_flags_imports_no_torch():
    code = ("import sys; from genbatch.cli import main\n"
            "main(['plan', '-m', 'flux.1-dev', '-g', '8', '--ulysses', '4', '--json'], standalone_mode=False)\n"
            "assert 'torch' not in sys.modules, 'gen plan imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["best"]["layout"] == "dp2-ulysses4"
