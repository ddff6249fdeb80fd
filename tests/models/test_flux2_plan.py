"""`gen plan` knows FLUX.2 [dev] and [klein] by their published shapes (the family modules' records, built from the
published configs), prices the text encoder as the runner holds it (Mistral 3's layers split over a job group),
rejects [dev] on one 80 GiB GPU naming the fix on more GPUs (FSDP or TP), and on eight GPUs ranks only layouts whose
job groups split the text encoder."""

from __future__ import annotations

import pytest

from genbatch.planner import plan
from genbatch.planner.hardware import GIB
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.workload import BYTES_PER_VALUE


def test_the_published_shapes_follow_the_published_configs():
    dev, klein, base = (resolve_shape(name) for name in ("flux.2-dev", "flux.2-klein", "flux.2-klein-base"))
    assert (dev.num_layers, dev.num_heads, dev.head_dim, dev.ffn_dim) == (8 + 48, 48, 128, 18432)
    assert (klein.num_layers, klein.num_heads) == (5 + 20, 24) and resolve_shape("flux.2-klein-9b").num_heads == 32
    assert not dev.uses_cfg and not klein.uses_cfg and base.uses_cfg
    assert dev.sequence(1024, 1024, None) == 512 + 2 * 4096  # the text, the output's tokens and a reference's
    assert round(dev.parameters / 1e9, 1) == 32.2 and round(dev.text_encoder_parameters / 1e9) == 24


def test_one_gpu_cannot_hold_flux2_dev_and_the_fix_is_fsdp_or_tp():
    result = plan("flux.2-dev", 1, gpu_mem=80)
    assert not result.ranked
    (single,) = result.rejected
    reason = single.reasons[0]
    # the 32B transformer (60 GiB in bf16) and the whole 24B text encoder (44.7 GiB) on the one GPU
    assert "weights 60.0, text_encoder 44.7" in reason, reason
    assert "on 2 x h100 it fits with" in reason and "--fsdp" in reason and "--tp 2" in reason, reason
    with pytest.raises(ValueError, match="no runnable layout.*--tp 2"):
        _ = result.best


def test_eight_gpus_rank_sharded_layouts_with_the_text_encoder_counted():
    result = plan("flux.2-dev", 8, gpu_mem=80)
    assert result.ranked
    dev = resolve_shape("flux.2-dev")
    whole = (dev.text_encoder_parameters - dev.text_encoder_split_parameters) * BYTES_PER_VALUE / GIB
    for candidate in result.ranked:
        layout, memory = candidate.layout, candidate.estimate.memory
        # a job group of one would hold the text encoder whole beside the transformer: 105 GiB
        assert layout.group_size > 1, layout.name
        # Mistral 3's 40 layers split over the job group, its embeddings, head and vision tower whole
        split = dev.text_encoder_split_parameters * BYTES_PER_VALUE / GIB / layout.group_size
        assert memory["text_encoder"] == pytest.approx(split + whole), layout.name
        assert memory["total"] <= 80
    assert not any(rejection.layout.name == "ulysses8" and rejection.fix is None for rejection in result.rejected)
    best = result.best.layout
    assert best.dp > 1 and best.tp > 1  # throughput: as many data-parallel groups as the memory allows
