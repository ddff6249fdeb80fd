"""`--text-encoder-parallel tp` over a job group that does not divide an encoder's heads or MLP width fails at
start-up, from the encoder's saved config (nothing built, no weights read), naming the encoder, the sizes and
the fix. For every encoder class the families split, over groups of 2, 3 and 4 ranks, the start-up check refuses
exactly the layouts the load-time check of the built, split encoder refuses.
"""

from __future__ import annotations

import pytest

from genbatch.parallel.tensor.encoders import check_splits
from genbatch.parallel.tensor.shard import _check_divides, resolved_styles
from tests.parallel.test_tensor_encoders import _encoders


def _saved(tmp_path, encoder, component="text_encoder") -> str:
    encoder.config.save_pretrained(str(tmp_path / component))
    return str(tmp_path)


def test_the_start_up_check_refuses_what_loading_refuses(tmp_path):
    outcomes = set()
    for name, (encoder, plan) in _encoders().items():
        path = _saved(tmp_path / name, encoder)
        styles = resolved_styles(encoder, plan)
        for size in (2, 3, 4):
            try:
                _check_divides(encoder, styles, size, "loading")
                refused_at_load = False
            except ValueError:
                refused_at_load = True
            try:
                check_splits(path, ("text_encoder",), "tp", size, fsdp=False)
                refused_at_start = False
            except ValueError:
                refused_at_start = True
            assert refused_at_start == refused_at_load, f"{name} over {size} ranks"
            outcomes.add(refused_at_load)
    assert outcomes == {True, False}  # some layouts split, others are refused


def test_a_group_that_does_not_divide_qwen_images_encoder_is_refused_naming_the_sizes_and_the_fix(tmp_path):
    encoder, _ = _encoders()["Qwen2_5_VLForConditionalGeneration"]  # 4 heads, 2 key/value heads, MLP 38
    path = _saved(tmp_path, encoder, "text_encoder")
    check_splits(path, ("text_encoder", "text_encoder_2"), "tp", 2, fsdp=False)  # a missing component: skipped
    with pytest.raises(ValueError, match=r"--text-encoder-parallel tp splits text_encoder over the 4 ranks of a job "
                                         r"group, which do not divide its num_key_value_heads 2, intermediate_size "
                                         r"38: choose a layout .* or --text-encoder-parallel replicate"):
        check_splits(path, ("text_encoder",), "tp", 4, fsdp=False)
    # auto keeps an encoder this narrow whole (or FSDP-sharded), a group of one splits nothing, a preset has no config
    check_splits(path, ("text_encoder",), "auto", 4, fsdp=False)
    check_splits(path, ("text_encoder",), "auto", 4, fsdp=True)
    check_splits(path, ("text_encoder",), "tp", 1, fsdp=False)
    check_splits(None, ("text_encoder",), "tp", 4, fsdp=False)
