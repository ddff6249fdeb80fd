"""Tensor-parallel layouts give the one-process output, by the criteria of `test_layouts.py` (fp32 latents
within 1e-5; decoded frames within 1e-4, equal after rounding to 8 bits but for values on a boundary).

The default suite runs tp 2 for each of the five tiny families (two ranks) and two composed layouts on four
ranks (cfg 2 x tp 2 for Wan, ulysses 2 x tp 2 with FSDP's 2-D layout for FLUX); the rest of the matrix (tp 2 x
ulysses 2, tp 2 x ring 2, tp 2 x cfg 2, tp 2 with FSDP, dp 2 x tp 2, and an 8-rank cfg x ulysses x tp) is
marked slow.
"""

from __future__ import annotations

import pytest

from tests.parallel.test_layouts import FLUX, HUNYUAN, QWEN, SD3, WAN, _all_layouts, _check, references  # noqa: F401
from tests.support.distributed import run_on_ranks

ALL = (WAN, FLUX, SD3, QWEN, HUNYUAN)
CFG = (WAN, SD3, QWEN)

# (job, dp, cfg, ring, ulysses, fsdp, tp)
TWO_RANKS = [(spec_job, 1, 1, 1, 1, False, 2) for spec_job in ALL]
FOUR_RANKS = [(WAN, 1, 2, 1, 1, False, 2), (FLUX, 1, 1, 1, 2, True, 2)]
FOUR_RANKS_SLOW = (
    [(spec_job, 1, 1, 1, 2, False, 2) for spec_job in ALL]  # tp 2 x ulysses 2
    + [(spec_job, 1, 1, 2, 1, False, 2) for spec_job in ALL]  # tp 2 x ring 2
    + [(spec_job, 1, 2, 1, 1, False, 2) for spec_job in (SD3, QWEN)]  # tp 2 x cfg 2 (Wan's is in the default)
    + [(spec_job, 1, 1, 2, 1, True, 2) for spec_job in ALL]  # tp 2 with FSDP over ring 2: the 2-D layout
    + [(spec_job, 1, 2, 1, 1, True, 2) for spec_job in CFG]  # tp 2 with FSDP over cfg 2
    + [(spec_job, 2, 1, 1, 1, False, 2) for spec_job in (WAN, FLUX, HUNYUAN)]  # dp 2 x tp 2
)
EIGHT_RANKS = [(spec_job, 1, 2, 1, 2, False, 2) for spec_job in CFG]  # cfg 2 x ulysses 2 x tp 2


def _equal_to_one_process(layouts, world_size, references, tmp_path, timeout_s=60):
    _check(layouts, run_on_ranks(_all_layouts, world_size, args=(layouts, str(tmp_path)), timeout_s=timeout_s),
           references)


def test_tp2_equals_one_process_for_every_family(references, tmp_path):
    _equal_to_one_process(TWO_RANKS, 2, references, tmp_path)


def test_tp_composed_with_cfg_and_with_ulysses_and_fsdp_equals_one_process(references, tmp_path):
    _equal_to_one_process(FOUR_RANKS, 4, references, tmp_path)


@pytest.mark.slow
def test_four_rank_tp_matrix_equals_one_process(references, tmp_path):
    _equal_to_one_process(FOUR_RANKS_SLOW, 4, references, tmp_path, timeout_s=90)


@pytest.mark.slow
def test_eight_rank_cfg_ulysses_tp_equals_one_process(references, tmp_path):
    _equal_to_one_process(EIGHT_RANKS, 8, references, tmp_path, timeout_s=120)
