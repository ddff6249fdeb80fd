"""Sequence-parallel attention side by side: seconds per call, bytes per rank, and the ratios that matter.

    python bench/attention.py [--world 2] [--tokens 4096]          # CPU: spawns gloo processes
    torchrun --nproc-per-node 4 bench/attention.py --device cuda    # GPUs: NCCL, one process per GPU

Prints, for one attention layer of shape (batch, tokens, heads, head_dim):
- local_attention (returns the lse) against plain SDPA on one process: time ratio (target about 1.00);
- for every Ulysses x Ring layout of the world: seconds per call, the ratio to one-process attention on the
  full sequence, bytes this rank sent, and measured/formula bytes (seed 000; target 1.00).
On 2 CPU cores the processes share the cores, so only the byte ratios and same-machine time ratios mean much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _timed(fn, reps: int, device: torch.device, together: bool = True) -> float:
    """Median seconds of `fn()` over `reps` runs after one warm-up (`together`: all ranks start each run
    at a barrier)."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if together:
            dist.barrier()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _layouts(world: int, heads: int) -> list[tuple[int, int]]:
    return [(u, world // u) for u in range(1, world + 1) if world % u == 0 and heads % u == 0]


def bench(rank: int, world: int, opts: argparse.Namespace) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh

    from genbatch.parallel.attention import (
        SequenceLayout, local_attention, ring_attention, ulysses_attention, usp_attention,
    )
    from genbatch.parallel.comm import Comm, CommLedger

    device = torch.device(opts.device, rank % max(torch.cuda.device_count(), 1)) if opts.device == "cuda" else torch.device("cpu")
    dtype = getattr(torch, opts.dtype)
    gen = torch.Generator().manual_seed(0)
    shape = (opts.batch, opts.tokens, opts.heads, opts.head_dim)
    q, k, v = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3))
    lines = []

    def sdpa():
        # (b, s, h, d) -> (b, h, s, d) -> (b, s, h, d)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    # one-process baselines on rank 0 alone (the other ranks wait), so they do not share the cores
    timing = torch.zeros(2, dtype=torch.float64)
    if rank == 0:
        timing[0] = _timed(lambda: local_attention(q, k, v), opts.reps, device, together=False)
        timing[1] = _timed(sdpa, opts.reps, device, together=False)
    timing = timing.to(device)
    dist.broadcast(timing, src=0)
    full, plain = timing.tolist()
    lines.append(f"one process: local_attention {full:.4f} s, SDPA {plain:.4f} s, ratio {full / plain:.2f}")
    layout = SequenceLayout.split(opts.tokens, world)
    d_bytes = opts.heads * opts.head_dim * opts.batch * q.element_size()
    for u, r in _layouts(world, opts.heads):
        mesh = init_device_mesh(device.type, (r, u), mesh_dim_names=("ring", "ulysses"))
        ul, ring = Comm(mesh.get_group("ulysses"), CommLedger()), Comm(mesh.get_group("ring"), CommLedger())
        sp_rank = ring.rank * u + ul.rank
        shard = [layout.shard(x, sp_rank).contiguous() for x in (q, k, v)]
        if r == 1:
            call = lambda: ulysses_attention(*shard, ul, layout)  # noqa: E731
        elif u == 1:
            call = lambda: ring_attention(*shard, ring, layout)  # noqa: E731
        else:
            call = lambda: usp_attention(*shard, ul, ring, layout)  # noqa: E731
        seconds = _timed(call, opts.reps, device)
        sent = (ul.ledger.total() + ring.ledger.total()) / (opts.reps + 1)
        formula = 4 * (u - 1) / u**2 * (opts.tokens / r) * d_bytes + 2 * (r - 1) / r * opts.tokens * d_bytes / u
        lines.append(
            f"ulysses {u} x ring {r}: {seconds:.4f} s/call ({seconds / full:.2f}x one process), "
            f"{sent / 1e6:.3f} MB sent by rank {rank}, measured/formula {sent / formula:.3f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="processes to spawn when not under torchrun")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    opts = parser.parse_args()
    print(f"attention (b={opts.batch}, N={opts.tokens}, h={opts.heads}, d={opts.head_dim}) {opts.dtype} on {opts.device}")
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if opts.device == "cuda" else "gloo")
        lines = bench(dist.get_rank(), dist.get_world_size(), opts)
        if dist.get_rank() == 0:
            print("\n".join(lines))
        dist.destroy_process_group()
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.support.distributed import run_on_ranks

    print("\n".join(run_on_ranks(bench, opts.world, (opts,), timeout_s=600)[0]))


if __name__ == "__main__":
    main()
