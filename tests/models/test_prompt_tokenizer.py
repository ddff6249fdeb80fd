"""The template tokenizer of the Qwen-Image and HunyuanVideo presets: the template's prefix is exactly the
number of tokens each pipeline crops, so what the transformer sees starts at the prompt, and distinct prompts
stay distinct through the crop."""

from __future__ import annotations

import pytest
from diffusers import QwenImagePipeline
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

from genbatch.models.prompt_tokenizer import template_tokenizer

_QWEN = QwenImagePipeline(None, None, None, None, None)
TEMPLATES = {
    "qwen-image": (_QWEN.prompt_template_encode, _QWEN.prompt_template_encode_start_idx),
    "hunyuan-video": (DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]),
}


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_the_crop_removes_exactly_the_template_prefix(family):
    template, crop = TEMPLATES[family]
    tokenizer = template_tokenizer(template, crop, model_max_length=1024)
    head = template.partition("{}")[0]
    assert len(tokenizer(head).input_ids) == crop
    ids = tokenizer(template.format("a red fox, jumping")).input_ids
    kept = tokenizer.convert_ids_to_tokens(ids[crop:])
    assert kept[:4] == ["a", "r", "##e", "##d"]  # an unknown word is spelled out a character at a time
    assert "<unk>" not in kept


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_distinct_prompts_stay_distinct_after_the_crop(family):
    template, crop = TEMPLATES[family]
    tokenizer = template_tokenizer(template, crop, model_max_length=1024)
    prompts = ["a red fox", "a red box", "a fox red", "A red fox", "a red fox!", "video of the color"]
    cropped = {tuple(tokenizer(template.format(p)).input_ids[crop:]) for p in prompts}
    assert len(cropped) == len(prompts)


def test_saved_and_reloaded_it_gives_the_same_ids(tmp_path):
    from transformers import AutoTokenizer

    template, crop = TEMPLATES["hunyuan-video"]
    tokenizer = template_tokenizer(template, crop, model_max_length=351)
    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = template.format("a lighthouse at dusk")
    assert again(text, padding="max_length", max_length=351).input_ids == tokenizer(
        text, padding="max_length", max_length=351).input_ids


def test_a_prefix_longer_than_the_crop_is_refused():
    with pytest.raises(ValueError, match="more than the 2 the pipeline crops"):
        template_tokenizer("<|im_start|>system prompt here {}", 2, model_max_length=64)
