"""VAE decode for a job group: patch-parallel over the group when it can be, else on the leader alone.

Patch-parallel decode (`genbatch.parallel.vae`) splits the latent into strips across the group and is exact.
A VAE class it does not know falls back to a one-rank decode on the leader (tiled where the VAE supports
tiling), with one warning per class.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from genbatch.parallel.context import ParallelContext


@dataclass(kw_only=True, slots=True)
class Decoder:
    ctx: ParallelContext
    parallel: bool = True
    """Decode patch-parallel across the job group when it has more than one rank (`--vae-parallel`)."""
    measure_memory: bool = True
    """Record the decode's peak memory on this rank (`last_peak_bytes`)."""
    last_peak_bytes: int | None = None
    _fallback: set = field(default_factory=set)
    """VAE classes without patch-parallel decode, decoded by the leader alone (tiled) after one warning."""

    def decode(self, pipe, vae_input: torch.Tensor) -> torch.Tensor | None:
        """Decoded pixels on the group leader; None on the other ranks."""
        from genbatch.parallel.vae import (
            decode_fallback,
            parallel_decode,
            peak_memory,
            supports_parallel_decode,
            unsupported_reason,
        )

        vae = pipe.vae
        group = self.ctx.group
        split = self.parallel and group.size > 1
        name = type(vae).__name__
        if split and not supports_parallel_decode(vae):
            split = False
            if name not in self._fallback:
                self._fallback.add(name)
                warnings.warn(f"no patch-parallel decode for {name} ({unsupported_reason(vae)}); the group leader "
                              "decodes alone, tiled where the VAE supports tiling", stacklevel=2)
        with peak_memory(self.ctx.device) as peak:
            if split:
                decoded = parallel_decode(vae, vae_input, group, leader_only=True)
            elif not self.ctx.is_leader:
                decoded = None
            elif name in self._fallback:
                decoded = decode_fallback(vae, vae_input)
            else:
                decoded = vae.decode(vae_input, return_dict=False)[0]  # exactly the pipeline's own decode
        self.last_peak_bytes = peak.bytes if self.measure_memory else None
        return decoded
