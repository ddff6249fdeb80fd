"""The axis table (`parallel/axes.py`) is the one place each degree is declared: the flags, the layout type,
the constraints and FSDP's default sub-mesh read it, and its one rule set serves both the runner's start-up
check and the planner's enumeration, which agree on every layout of up to 8 ranks."""

from __future__ import annotations

from dataclasses import fields

import pytest

from genbatch.parallel.axes import AXES, AXIS, DEFAULT_FSDP_AXES, GROUP_AXES
from genbatch.parallel.dims import LayoutRequest, ParallelDims
from genbatch.planner.constraints import LayoutConstraints
from genbatch.planner.layouts import enumerate_layouts


def _factorings(world_size: int, axes: tuple[str, ...]):
    """Every way to write `world_size` as a product over `axes`, any degree (cfg 4 too: the rules refuse it)."""
    if not axes:
        if world_size == 1:
            yield {}
        return
    for degree in (d for d in range(1, world_size + 1) if world_size % d == 0):
        for rest in _factorings(world_size // degree, axes[1:]):
            yield {axes[0]: degree, **rest}


def _runner_takes(world_size: int, degrees: dict, fsdp: bool, cache: bool, quantization: str = "none") -> bool:
    """What `gen run`'s start-up makes of these flags on `world_size` processes (runner/world.py's steps)."""
    group = {axis: degrees[axis] for axis in GROUP_AXES}
    try:
        dims = LayoutRequest.of(dp=degrees["dp"], fsdp=fsdp, **group).resolve(world_size, cache=cache,
                                                                            quantization=quantization)
        dims.check(cache=cache, quantization=quantization)
    except ValueError as error:
        assert str(error).startswith("--"), error  # every refusal names a flag first
        return False
    assert dims.degrees() == degrees
    return True


@pytest.mark.parametrize("cache, quantization", [(False, "none"), (True, "none"), (False, "fp8")],
                         ids=["exact", "with-a-step-cache", "quantized"])
def test_the_planner_ranks_every_layout_the_runner_runs_and_none_it_refuses(cache, quantization):
    every = set()
    for world_size in range(1, 9):
        planned = set(enumerate_layouts(world_size, cache=cache, quantization=quantization))
        runs = {ParallelDims(fsdp=fsdp, **degrees)
                for degrees in _factorings(world_size, AXES) for fsdp in (False, True)
                if _runner_takes(world_size, degrees, fsdp, cache, quantization)}
        assert planned == runs, (world_size, planned ^ runs)
        assert len(enumerate_layouts(world_size, cache=cache, quantization=quantization)) == len(planned)
        assert ParallelDims(dp=world_size) in runs
        every |= runs
    quantized = quantization != "none"
    assert (ParallelDims(tp=2, ulysses=2, fsdp=True) in every) is not quantized  # tp and pp with FSDP
    assert all(layout.fsdp_size > 1 for layout in every if layout.fsdp)  # never FSDP over one rank
    assert ParallelDims(tp=2, fsdp=True) not in every and ParallelDims(pp=2, dp=2, fsdp=True) not in every
    assert (ParallelDims(pp=2, cfg=2, fsdp=True) in every) is not (cache or quantized)  # no cache beside stale K/V
    assert not quantized or not any(layout.tp > 1 or layout.fsdp for layout in every)  # torchao's tensors
    assert ParallelDims(pp=2, ulysses=2, cfg=2) in every or cache  # the rest composes (pp: not with a cache)


def test_each_rule_names_the_flags_and_a_fix():
    cases = {
        ParallelDims(cfg=4): "--cfg 4: CFG parallel",
        ParallelDims(distrifusion=2, ulysses=2): "--distrifusion 2 does not compose with --ulysses 2",
        ParallelDims(distrifusion=2, cfg=2, fsdp=True): "--distrifusion 2 does not compose with --fsdp",
        ParallelDims(dp=2, fsdp=True): "--fsdp shards weights over a job group's ranks.*one rank each",
        # FSDP over one rank is no layout: tp's and pp's ranks hold different weights, so nothing is left to shard
        ParallelDims(tp=2, fsdp=True): "--fsdp shards weights .* FSDP would shard over one rank",
        ParallelDims(dp=2, pp=2, fsdp=True): "--fsdp shards weights .* FSDP would shard over one rank",
    }
    for dims, message in cases.items():
        with pytest.raises(ValueError, match=message):
            dims.check()
    with pytest.raises(ValueError, match="--cache with --pp 2: step caching does not run with PipeFusion"):
        ParallelDims(pp=2).check(cache=True)
    with pytest.raises(ValueError, match="--tp 2 with --quantization int8: torchao's quantized weights .* give these "
                                         "ranks to --ulysses or --ring"):
        ParallelDims(tp=2).check(quantization="int8")
    with pytest.raises(ValueError, match="--fsdp with --quantization fp8: .*; drop --fsdp"):
        ParallelDims(ulysses=2, fsdp=True).check(quantization="fp8")
    ParallelDims(cfg=2, distrifusion=2, dp=2).check()


def test_the_layout_type_the_flags_and_the_constraints_have_one_field_per_axis():
    from genbatch.parallel.flags import layout_options
    from genbatch.planner.cli import plan_command
    from genbatch.runner.cli import run_command

    assert [field.name for field in fields(ParallelDims)] == [*AXES, "fsdp", "fsdp_axes"]
    assert ParallelDims().fsdp_axes == DEFAULT_FSDP_AXES == tuple(a for a in GROUP_AXES if AXIS[a].fsdp_shards)
    assert "tp" not in DEFAULT_FSDP_AXES and "pp" not in DEFAULT_FSDP_AXES
    for command in (run_command, plan_command):
        params = {param.name: param for param in command.params}
        for name in AXES:
            assert params[name].opts[:1 + len(AXIS[name].aliases)] == [f"--{name}", *AXIS[name].aliases]
            assert params[name].type.max == AXIS[name].max_degree
    run_params = {param.name: param for param in run_command.params}
    assert all(run_params[name].help == AXIS[name].help for name in AXES)
    assert layout_options(constraints=True)  # the same definition serves both commands
    for name in AXES:
        assert LayoutConstraints(**{name: 2}).admits(ParallelDims(**{name: 2, "dp": 2 if name != "dp" else 2}))
    request = LayoutRequest.of(ulysses=2, pp=1, fsdp=True)
    assert request.degrees == {"ulysses": 2} and request.flags() == {
        "dp": None, **{axis: 2 if axis == "ulysses" else 1 for axis in GROUP_AXES}, "fsdp": True}
    assert request.resolve(8) == ParallelDims(dp=4, ulysses=2, fsdp=True)
    with pytest.raises(ValueError, match="not job-group axes"):
        LayoutRequest.of(sequence=2)
