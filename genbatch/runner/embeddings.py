"""Prompts encoded once: an LRU of each rank's prompt encodes, bounded in bytes (`--embedding-cache-gib`).

A row's encode depends on its model (which fixes the text encoders and their maximum length), its prompt and
negative prompt, its guidance scale (which decides the branches), its input images (Qwen-Image-Edit's and
Wan I2V's encoders see them) and its adapters (which may change a text encoder). Rows that agree on all of
these share one encode:

    cache = EmbeddingCache(max_bytes=2 * 2**30)
    conditioning, hit = cache.get(embedding_key(job), lambda: family.encode(pipe, job, device))

Every rank of a job group runs the same jobs in the same order, so its ranks hit and miss together. The
stored tensors are the encode's own: what comes out equals a fresh encode bit for bit. A cached value is
never changed by its users (`FamilyHooks.batch_conditioning` copies the dicts it is given). An encode larger than
the whole bound is returned and not kept.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from genbatch.jobs.prepared import PreparedJob
from genbatch.models.hooks import Conditioning

DEFAULT_GIB = 2.0
"""`--embedding-cache-gib`'s default."""


def embedding_key(job: PreparedJob) -> tuple:
    """What a row's prompt encode depends on (see the module docstring)."""
    inputs = json.dumps(job.fingerprint(shaping_encode=True), sort_keys=True)  # its images', its adapters'
    return (job.model, job.prompt, job.negative_prompt, job.guidance_scale, inputs)


def conditioning_bytes(conditioning: Conditioning) -> int:
    """The bytes of the tensors a conditioning holds."""
    total = 0
    for kwargs in conditioning.branches.values():
        for value in kwargs.values():
            if hasattr(value, "element_size"):
                total += value.element_size() * value.nelement()
    return total


@dataclass(kw_only=True, slots=True)
class EmbeddingCache:
    """The most recently used encodes whose tensors fit in `max_bytes` (0: nothing is kept)."""

    max_bytes: int
    """The bound on the bytes of the kept encodes' tensors."""
    held_bytes: int = 0
    """The bytes kept now."""
    hits: int = 0
    """Encodes served from the cache so far."""
    misses: int = 0
    """Encodes run so far."""
    _entries: OrderedDict = field(default_factory=OrderedDict)
    """key -> (conditioning, its bytes), least recently used first."""

    def get(self, key: tuple, encode: Callable[[], Conditioning]) -> tuple[Conditioning, bool]:
        """(the encode for `key`, whether it was cached): `encode()` runs on a miss."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key][0], True
        self.misses += 1
        conditioning = encode()
        size = conditioning_bytes(conditioning)
        if size <= self.max_bytes:
            self._entries[key] = (conditioning, size)
            self.held_bytes += size
            while self.held_bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.held_bytes -= dropped
        return conditioning, False

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.held_bytes = 0
