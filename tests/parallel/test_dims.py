"""ParallelDims: any layout is representable; validated once at start-up, errors that name the bad value and a
layout that would work."""

import pytest

from genbatch.parallel.dims import ParallelDims


def test_dp_takes_the_rest():
    assert ParallelDims.infer(8, cfg=2, ulysses=2) == ParallelDims(dp=2, cfg=2, ulysses=2)
    assert ParallelDims.infer(4) == ParallelDims(dp=4)
    assert ParallelDims(dp=2, cfg=2, ring=1, ulysses=2).group_size == 4


def test_degrees_that_do_not_divide_the_world():
    with pytest.raises(ValueError, match=r"does not divide the world size 6.*\[1, 2, 3, 6\]"):
        ParallelDims.infer(6, ulysses=4)


def test_world_size_mismatch_names_a_fix():
    with pytest.raises(ValueError, match="--dp 2"):
        ParallelDims(dp=1, ulysses=2).validate(world_size=4, num_heads=8, uses_cfg=True)


def test_ulysses_must_divide_the_heads():
    with pytest.raises(ValueError, match=r"--ulysses 3 does not divide the model's 4 attention heads.*\[1, 2\]"):
        ParallelDims(ulysses=3, dp=2).validate(world_size=6, num_heads=4, uses_cfg=True)


def test_cfg_only_for_cfg_models():
    with pytest.raises(ValueError, match="--cfg 2 needs a model that runs classifier-free guidance"):
        ParallelDims(cfg=2).validate(world_size=2, num_heads=24, uses_cfg=False)
    ParallelDims(cfg=2).validate(world_size=2, num_heads=40, uses_cfg=True)


def test_non_positive_degrees():
    with pytest.raises(ValueError, match="--ring 0 must be at least 1"):
        ParallelDims.infer(4, ring=0)


def test_degrees_and_spans_follow_the_mesh_order():
    dims = ParallelDims(dp=2, cfg=2, pp=2, ulysses=4, tp=2)
    assert dims.degrees() == {"dp": 2, "cfg": 2, "distrifusion": 1, "pp": 2, "ring": 1, "ulysses": 4, "tp": 2}
    assert [dims.span(axis) for axis in ("dp", "cfg", "ulysses", "tp")] == [(32, 2), (16, 2), (2, 4), (1, 2)]
    assert dims.sp == 4 and dims.fsdp_size == 1 and ParallelDims(cfg=2, ulysses=4, fsdp=True).fsdp_size == 8


@pytest.mark.parametrize("others", [{"ulysses": 2}, {"ring": 2}, {"tp": 2}, {"fsdp": True}],
                         ids=["ulysses", "ring", "tp", "fsdp"])
def test_distrifusion_composes_with_cfg_and_dp_only(others):
    ParallelDims(dp=2, cfg=2, distrifusion=2).validate(world_size=8, num_heads=4, uses_cfg=True)
    with pytest.raises(ValueError, match=r"--distrifusion 2 does not compose with --(ulysses|ring|tp|fsdp).*--cfg "
                                         r"and --dp only"):
        ParallelDims(distrifusion=2, **others).validate(world_size=4 if "fsdp" not in others else 2, num_heads=4,
                                                        uses_cfg=True)
    assert ParallelDims.parse("cfg2-distrifusion2").distrifusion == 2
