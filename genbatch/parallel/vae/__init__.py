"""Patch-parallel VAE decode: every rank of a group decodes a tile of the latent; the result is exact.

    from genbatch.parallel.vae import supports_parallel_decode, parallel_decode, decode_fallback, peak_memory
"""

from genbatch.parallel.vae.decode import decode_fallback, parallel_decode
from genbatch.parallel.vae.memory import PeakMemory, peak_memory
from genbatch.parallel.vae.plan import supports_parallel_decode, unsupported_reason

__all__ = [
    "PeakMemory",
    "decode_fallback",
    "parallel_decode",
    "peak_memory",
    "supports_parallel_decode",
    "unsupported_reason",
]
