"""The mesh with room for every axis: the axes' order, the registry of runnable axes, the one layout-name
grammar, and every rank's groups as a pure function, checked against a real DeviceMesh of 512 fake ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from genbatch.parallel.axes import AXES
from genbatch.parallel.dims import ParallelDims
from genbatch.parallel.groups import coordinates, rank_groups
from tests.support.runs import REPO


def test_axes_outermost_first_tp_innermost():
    assert AXES == ("dp", "cfg", "distrifusion", "pp", "ring", "ulysses", "tp")


@pytest.mark.parametrize("name", ["single", "dp2", "cfg2-ulysses2", "dp2-cfg2-ulysses4-fsdp", "ring2-ulysses2-fsdp"])
def test_layout_names_read_back(name):
    assert ParallelDims.parse(name).name == name


def test_layout_name_lists_degrees_outermost_first():
    assert ParallelDims(dp=2, cfg=2, ulysses=4, fsdp=True).name == "dp2-cfg2-ulysses4-fsdp"
    assert ParallelDims.parse("ulysses4-dp2") == ParallelDims(dp=2, ulysses=4)  # any order reads
    for bad in ("ulysses", "dp2-dp2", "sp4", "dp0", "fsdp2"):
        with pytest.raises(ValueError, match="cannot read"):
            ParallelDims.parse(bad)


def test_coordinates_vary_fastest_on_the_last_axis():
    dims = ParallelDims(dp=2, cfg=2, ring=2, ulysses=2)
    assert coordinates(dims, 0) == dict.fromkeys(AXES, 0)
    assert coordinates(dims, 1)["ulysses"] == 1 and coordinates(dims, 2)["ring"] == 1
    assert coordinates(dims, 15) == {"dp": 1, "cfg": 1, "distrifusion": 0, "pp": 0, "ring": 1, "ulysses": 1, "tp": 0}
    with pytest.raises(ValueError, match="outside the layout"):
        coordinates(dims, 16)


def test_groups_of_a_small_layout():
    groups = rank_groups(ParallelDims(dp=2, cfg=2, ulysses=2, fsdp=True), 5)
    assert groups["dp"] == (1, 5) and groups["cfg"] == (5, 7) and groups["ulysses"] == (4, 5)
    assert groups["group"] == (4, 5, 6, 7) == groups["fsdp"]  # FSDP: the job group minus tp and pp
    assert groups["sp"] == (4, 5) and groups["ring"] == groups["pp"] == groups["tp"] == (5,)


def test_every_rank_is_in_exactly_one_group_per_axis():
    dims = ParallelDims(dp=2, cfg=2, ring=2, ulysses=3)
    for name in ("dp", "cfg", "ring", "ulysses", "group", "sp"):
        groups = {rank_groups(dims, rank)[name] for rank in range(dims.world_size)}
        members = sorted(rank for group in groups for rank in group)
        assert members == list(range(dims.world_size)), name


def test_a_512_rank_fake_mesh_equals_the_pure_function():
    """dp 8 x cfg 2 x ring 4 x ulysses 8: rank 0, one in the middle and the last, on torch's fake backend."""
    layout = "dp8-cfg2-ring4-ulysses8-fsdp"
    result = subprocess.run([sys.executable, "-m", "tests.parallel.fake_mesh_check", layout, "0", "259", "511"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 259", "rank 511"]
    assert "group=64@0 " in lines[0] and "group=64@448 " in lines[2] and "dp=8@3 " in lines[1], lines
