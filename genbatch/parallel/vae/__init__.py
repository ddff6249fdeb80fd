"""Patch-parallel VAE decode and encode: every rank of a group works on a tile; the result is one rank's within
floating-point rounding (the same terms, summed in another order; not bit for bit).

    from genbatch.parallel.vae import supports_parallel_decode, parallel_decode, decode_fallback, peak_memory
    from genbatch.parallel.vae import supports_parallel_encode, parallel_encode, parallel_encoding
"""

from genbatch.parallel.vae.decode import decode_fallback, parallel_decode
from genbatch.parallel.vae.encode import parallel_encode, parallel_encoding, supports_parallel_encode
from genbatch.parallel.vae.memory import PeakMemory, peak_memory
from genbatch.parallel.vae.forwards import supports_parallel_decode, unsupported_reason

__all__ = [
    "PeakMemory",
    "decode_fallback",
    "parallel_decode",
    "parallel_encode",
    "parallel_encoding",
    "peak_memory",
    "supports_parallel_decode",
    "supports_parallel_encode",
    "unsupported_reason",
]
