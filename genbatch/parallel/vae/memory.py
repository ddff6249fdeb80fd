"""Peak tensor memory of a block of code, on CUDA and on CPU, for benchmarks and the timings table.

    with peak_memory() as peak:
        image = parallel_decode(vae, latents, comm)
    peak.bytes           # the most bytes of tensors made inside the block that were alive at one time

CUDA asks the caching allocator (`max_memory_allocated`). The CPU allocator keeps no statistics, so on CPU
a `TorchDispatchMode` sees every tensor an operator makes, counts the bytes of each new storage, and a weak
reference on the storage takes them off again when it is freed. Storages that existed before the block
(weights, inputs) are not counted; work buffers inside a kernel are not tensors and are not seen. On the meta
device the same count runs without computing anything (shapes only): a real-size decoder's peak in seconds,
which equals the CPU count where an operator's meta kernel makes the tensors its CPU kernel does (not so for
fused attention, which meta decomposes into its math form).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(slots=True, kw_only=True)
class PeakMemory:
    """What `peak_memory()` measured; filled in when the block exits."""

    device: str
    """The device measured: 'cuda:N', 'cpu' or 'meta'."""
    bytes: int = 0
    """The most bytes of tensors allocated inside the block that were alive at once (above the level at entry)."""


class _LiveStorages(TorchDispatchMode):
    """Counts the bytes of storages operators create while active, and their peak."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.active = True
        self._refs: dict[int, weakref.ref] = {}

    def _freed(self, key: int, nbytes: int, _ref) -> None:
        self._refs.pop(key, None)
        if self.active:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
                continue
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._refs:
                continue  # a view or an in-place result of an input, or a storage already counted
            nbytes = storage.nbytes()
            self._refs[key] = weakref.ref(storage, partial(self._freed, key, nbytes))
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        return out


@contextmanager
def peak_memory(device: torch.device | str | None = None) -> Iterator[PeakMemory]:
    """Measure the peak tensor memory of the block on `device` (default: the current CUDA device, else CPU)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        result = PeakMemory(device=str(device))
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = torch.cuda.max_memory_allocated(device) - base
        return
    if device.type not in ("cpu", "meta"):
        raise ValueError(f"peak_memory measures 'cuda', 'cpu' or 'meta' devices, not {device}; pass one of those")
    result = PeakMemory(device=device.type)
    tracker = _LiveStorages(device.type)
    try:
        with tracker:
            yield result
    finally:
        tracker.active = False
        result.bytes = tracker.peak
