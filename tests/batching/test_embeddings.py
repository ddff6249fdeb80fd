"""The embedding cache: bounded in bytes, least recently used out first, an encode larger than the bound not kept."""

import torch

from genbatch.models.hooks import COND, Conditioning
from genbatch.runner.embeddings import EmbeddingCache, conditioning_bytes


def _encode(values: int):
    calls = []

    def encode():
        calls.append(values)
        return Conditioning(branches={COND: {"encoder_hidden_states": torch.zeros(1, values)}}, guidance_scale=1.0)
    return encode, calls


def test_the_least_recently_used_encode_goes_first_and_the_bound_holds():
    cache = EmbeddingCache(max_bytes=3 * 4 * 100)  # three encodes of 100 fp32 values
    encoders = {name: _encode(100) for name in "abcd"}
    for name in "abc":
        cache.get(name, encoders[name][0])
    first, hit = cache.get("a", encoders["a"][0])  # a is now the most recently used
    assert hit and encoders["a"][1] == [100] and conditioning_bytes(first) == 400
    cache.get("d", encoders["d"][0])  # evicts b, the least recently used
    assert cache.held_bytes == 1200 and len(cache) == 3
    assert cache.get("b", encoders["b"][0])[1] is False and encoders["b"][1] == [100, 100]
    assert cache.get("a", encoders["a"][0])[1] is True  # b's return evicted c, used before a
    assert cache.get("c", encoders["c"][0])[1] is False and encoders["c"][1] == [100, 100]
    assert (cache.hits, cache.misses) == (2, 6)


def test_an_encode_larger_than_the_bound_is_returned_and_not_kept():
    cache = EmbeddingCache(max_bytes=100)
    encode, calls = _encode(1000)
    assert cache.get("big", encode)[1] is False and cache.get("big", encode)[1] is False
    assert calls == [1000, 1000] and len(cache) == 0 and cache.held_bytes == 0
