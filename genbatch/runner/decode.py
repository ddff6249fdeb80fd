"""VAE decode for a job group in one of four modes (`gen run --vae-decode`):

- `parallel`: patch-parallel over the job group (`genbatch.parallel.vae`): every rank decodes a strip, exact
  within floating-point rounding (not bit for bit);
- `full`: the group's leader decodes alone with the pipeline's own decode, exact;
- `tiled`: the leader decodes alone with the VAE's own tiling (diffusers' `enable_tiling`): the least memory, but
  tiles are blended, so the output is not the full decode's;
- `auto` (the default): per job, the first exact mode whose decode peak fits the memory a rank has left
  (parallel where the group and the VAE allow it, then full), and tiled only when neither does. The peaks
  come from the planner's model of that VAE class (`genbatch.planner.vae_memory`), the one `gen plan` uses.

A mode the job's VAE cannot run fails the run at start-up (`check`); under `auto`, a VAE without patch-parallel
decode decodes on the leader (full, or tiled when full does not fit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genbatch.parallel.context import ParallelContext
from genbatch.planner.memory import DECODE_CHOICES
from genbatch.models.registry import vae_costs_of_class
from genbatch.planner.vae_memory import EXACT_MODES, decode_peak_bytes, first_fitting


def can_tile(vae) -> bool:
    """Whether the VAE has diffusers' own tiling (`enable_tiling` and the `use_tiling` switch)."""
    return hasattr(vae, "enable_tiling") and hasattr(vae, "use_tiling")


def device_memory_bytes(device: torch.device) -> int:
    """What one rank may fill: the GPU's memory, or on a CPU the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _group_in_use_bytes(ctx: ParallelContext) -> int:
    """Bytes already held on the device (weights, what the denoise left) by the fullest rank of the group: CUDA's
    allocator, 0 on a CPU. The group agrees on it (one all-reduce on GPUs), so every rank picks the same mode."""
    if ctx.device.type != "cuda":
        return 0
    used = torch.tensor([torch.cuda.memory_allocated(ctx.device)], dtype=torch.int64, device=ctx.device)
    if ctx.group.size > 1:
        import torch.distributed as dist

        ctx.group.all_reduce(used, op=dist.ReduceOp.MAX, kind="decode_choice")
    return int(used.item())


def _channels(vae) -> int | None:
    """The decoder's output-side channel width, from its config (Wan's `base_dim`, else `block_out_channels[0]`)."""
    config = getattr(vae, "config", {})
    if config.get("base_dim"):
        return int(config["base_dim"])
    channels = config.get("block_out_channels")
    return int(channels[0]) if channels else None


def mode_problem(mode: str, spec) -> str | None:
    """Why `--vae-decode mode` cannot decode the model of `spec` (a `ModelSpec`), naming the fix; None if it can.
    Asked at start-up, from the VAE's class alone (no weights loaded)."""
    import diffusers

    from genbatch.planner.memory import patch_parallel_classes
    from genbatch.planner.shapes import resolve_shape

    name = resolve_shape(spec).vae_class
    vae_class = getattr(diffusers, name, None) if name else None
    if mode == "tiled" and vae_class is not None and not hasattr(vae_class, "enable_tiling"):
        return f"--vae-decode tiled: {name} has no tiling of its own (no enable_tiling); use --vae-decode full or auto"
    if mode == "parallel" and name not in patch_parallel_classes():
        return (f"--vae-decode parallel: genbatch has no patch-parallel decode for {name or 'its VAE'}; use "
                "--vae-decode full, tiled or auto")
    return None


def _tile(vae) -> tuple[int, int] | None:
    """(height, width) in pixels of one tile of the VAE's own tiling, as configured on this instance."""
    if hasattr(vae, "tile_sample_min_height"):
        return int(vae.tile_sample_min_height), int(vae.tile_sample_min_width)
    size = getattr(vae, "tile_sample_min_size", None)  # AutoencoderKL: square tiles of its sample size
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return (int(size), int(size)) if size else None


@dataclass(kw_only=True, slots=True)
class Decoder:
    ctx: ParallelContext
    mode: str = "auto"
    """`--vae-decode`: auto, full, tiled or parallel."""
    memory_bytes: int | None = None
    """Memory a rank may fill, for `auto`'s choice (`--vae-memory`; None: the device's, `device_memory_bytes`)."""
    measure_memory: bool = True
    """Record the decode's peak memory on this rank (`last_peak_bytes`)."""
    last_peak_bytes: int | None = None
    last_mode: str | None = None
    """The mode the last job decoded in (what its results row records)."""

    def __post_init__(self) -> None:
        if self.mode not in DECODE_CHOICES:
            raise ValueError(f"--vae-decode {self.mode!r}: choose one of {', '.join(DECODE_CHOICES)}")

    def check(self, vae) -> None:
        """ValueError naming the problem and the fix when the chosen mode cannot decode this VAE."""
        from genbatch.parallel.vae import unsupported_reason

        name = type(vae).__name__
        if self.mode == "tiled" and not can_tile(vae):
            raise ValueError(f"--vae-decode tiled: {name} has no tiling of its own (no enable_tiling); "
                             "use --vae-decode full or auto")
        if self.mode == "parallel":
            reason = unsupported_reason(vae)
            if reason is not None:
                raise ValueError(f"--vae-decode parallel: no patch-parallel decode for {name} ({reason}); "
                                 "use --vae-decode full, tiled or auto")

    def modes(self, vae) -> tuple[str, ...]:
        """The modes this group can decode `vae` in: exact ones first (`auto`'s order), then tiled."""
        from genbatch.parallel.vae import supports_parallel_decode

        split = self.ctx.group.size > 1 and supports_parallel_decode(vae)
        exact = tuple(mode for mode in EXACT_MODES if mode == "full" or split)
        return exact + (("tiled",) if can_tile(vae) else ())

    def choose(self, vae, latents: torch.Tensor, size: tuple[int, int, int | None]) -> str:
        """The mode for a job of `size` (width, height, frames): the one asked, or `auto`'s choice. Every rank of
        the group chooses alike: the same model, sizes, limit and memory in use (the group's fullest rank's)."""
        if self.mode != "auto":
            self.check(vae)
            return "full" if self.mode == "parallel" and self.ctx.group.size == 1 else self.mode
        width, height, frames = size
        memory = vae_costs_of_class(type(vae).__name__, is_video=latents.ndim == 5).decoder
        channels, tile, value = _channels(vae), _tile(vae), latents.element_size()
        limit = self.memory_bytes if self.memory_bytes is not None else device_memory_bytes(self.ctx.device)
        budget = limit - _group_in_use_bytes(self.ctx)
        group = self.ctx.group.size

        def needs(mode: str) -> float:
            ranks = group if mode == "parallel" else 1
            return decode_peak_bytes(memory, mode, width=width, height=height, frames=frames, ranks=ranks,
                                     bytes_per_value=value, channels=channels, tile=tile)

        return first_fitting(self.modes(vae), needs, budget)

    def decode(self, pipe, vae_input: torch.Tensor, size: tuple[int, int, int | None]) -> torch.Tensor | None:
        """Decoded pixels on the group leader (None on the other ranks) for a job of `size` (width, height,
        frames or None)."""
        from genbatch.parallel.vae import decode_fallback, parallel_decode, peak_memory

        vae = pipe.vae
        mode = self.choose(vae, vae_input, size)
        with peak_memory(self.ctx.device) as peak:
            if mode == "parallel":
                decoded = parallel_decode(vae, vae_input, self.ctx.group, leader_only=True)
            elif not self.ctx.is_leader:
                decoded = None
            elif mode == "tiled":
                decoded = decode_fallback(vae, vae_input)  # diffusers' tiling, its switch restored after
            else:
                decoded = vae.decode(vae_input, return_dict=False)[0]  # exactly the pipeline's own decode
        self.last_peak_bytes = peak.bytes if self.measure_memory else None
        self.last_mode = mode
        return decoded
