"""How many rows fit in one forward: `gen run --batch-size auto`.

    largest_batch(ParallelDims(ulysses=4), work, limit_gib=80.0)          # 16 at FLUX.1-dev 512x512
    largest_batch_for("flux.1-dev", 1024, 1024, None, ParallelDims(), gpu_mem_gib=80.0)

A batch of N rows holds N times one row's denoise activations (and stale K/V) on each rank; the weights, the
text encoders and the VAE's weights do not grow, and the VAE encode and decode run row by row, so their peaks
stay one row's (`memory.memory_per_rank`). The largest batch is the largest N whose peak fits the memory a rank
may fill on the group's fullest rank, the leader (which also gathers the decoded output).
"""

from __future__ import annotations

from dataclasses import replace

from genbatch.models.spec import ModelSpec
from genbatch.parallel.dims import ParallelDims
from genbatch.planner.memory import choose_decode, memory_per_rank
from genbatch.planner.rank import workload_for
from genbatch.planner.shapes import ModelShape, resolve_shape
from genbatch.planner.workload import Workload

MOST_ROWS = 16
"""The most rows `--batch-size auto` puts in one forward (issue 29)."""


def largest_batch(layout: ParallelDims, work: Workload, limit_gib: float, most: int = MOST_ROWS,
                  decode: str = "auto") -> int:
    """The largest batch N <= `most` whose per-rank peak fits in `limit_gib` GiB on `layout`'s fullest rank.

    `work` is one row's job (its `batch` is ignored); `limit_gib` is the memory a GPU may fill (the planner's
    `--gpu-mem`: the CUDA context and allocator slack, `memory.RESERVE_GIB`, are already counted in the peak);
    `decode` is the run's `--vae-decode` (with `auto`, the mode `auto` takes for one row: the decode does not
    grow with N). The peak is `memory_per_rank`'s total at batch N: weights, text encoders and the VAE's
    weights once, plus the largest of N rows' activations (and stale K/V), one row's VAE decode and one row's
    VAE encode. Returns 1 when even one row does not fit (the runner then runs rows alone and the planner's own
    memory check names the fix). ValueError when `most` is below 1 or `decode` is not a mode the layout runs.
    """
    if most < 1:
        raise ValueError(f"the largest batch to try must be at least 1, not {most}")
    one = replace(work, batch=1)
    mode = choose_decode(layout, one, limit_gib, decode)
    fits = 1
    for rows in range(2, most + 1):
        if memory_per_rank(layout, replace(work, batch=rows), mode)["total"] > limit_gib:
            break  # the peak grows with the rows: no larger batch fits either
        fits = rows
    return fits


def largest_batch_for(model: str | ModelSpec | ModelShape, width: int | None, height: int | None,
                      frames: int | None, dims: ParallelDims, gpu_mem_gib: float, *, steps: int | None = None,
                      guidance: float | None = None, decode: str = "auto", offload_text_encoder: bool = False,
                      image: bool | None = None, most: int = MOST_ROWS) -> int:
    """`largest_batch` for rows of `model` (a published name, preset, pipeline directory, spec or shape) at
    `width` x `height` (x `frames`; None: the model's defaults) on the layout `dims`, with `gpu_mem_gib` GiB per
    GPU; `guidance` of 1 or less runs one branch a step, as `plan` prices it; `image`: whether the rows start
    from an image (None: as the model does), whose VAE encode then counts too."""
    shape = resolve_shape(model)
    if guidance is not None and guidance <= 1.0 and shape.uses_cfg:
        shape = replace(shape, uses_cfg=False)  # one forward a step, as the model runs such a row
    work = workload_for(shape, width=width, height=height, frames=frames, steps=steps,
                        offload_text_encoder=offload_text_encoder, image=image)
    return largest_batch(dims, work, gpu_mem_gib, most=most, decode=decode)


__all__ = ["MOST_ROWS", "largest_batch", "largest_batch_for"]
