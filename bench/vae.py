"""Patch-parallel VAE decode (and Wan's encode) side by side with one rank's: seconds, peak memory per rank, ratios.

    python bench/vae.py [--worlds 2 4] [--vae wan image wan-encode]   # CPU: one rank, then gloo processes per world
    torchrun --nproc-per-node 4 bench/vae.py --device cuda       # GPUs: NCCL, that world size only

For each VAE (a Wan 2.1-layout AutoencoderKLWan and an SD3/Flux-layout AutoencoderKL, random weights, a
third of the real width) and each world size p it prints the decode seconds (slowest rank), the peak tensor
memory of the decode on the leader and on the other ranks (CPU: live tensors seen by a dispatch mode; CUDA:
max_memory_allocated), both as ratios to one rank, the bytes each rank sent, and the memory target:
peak(p) <= 1.25/p * peak(1) + the output image (which the leader has to hold whole). `wan-encode` encodes the
pixels of the Wan latent's size (an image-to-video row's conditioning video, 5 frames) with the same VAE;
every rank holds the whole latent after it, which is its output here.
The processes run one thread each; with p above the free core count they share cores, so the wall-clock
ratio only means something up to p = free cores; the CPU seconds of each rank's main thread (all of its
compute) are the work ratio, whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

CONFIGS = {
    "wan": dict(base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True]),
    "image": dict(
        block_out_channels=[32, 64, 128, 128],
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=2,
        latent_channels=16,
        norm_num_groups=32,
    ),
}
CONFIGS["wan-encode"] = CONFIGS["wan"]
LATENTS = {"wan": (1, 16, 2, 24, 32), "image": (1, 16, 64, 64), "wan-encode": (1, 3, 5, 192, 256)}
"""Each case's input: a latent to decode, or (wan-encode) the pixels to encode."""


def _run(name: str, vae, inputs, comm):
    """The case's parallel work: the decoded image (on the leader), or the encoded latent's moments (everywhere)."""
    from genbatch.parallel.vae import parallel_decode, parallel_encode

    if name == "wan-encode":
        return parallel_encode(vae, inputs, comm).parameters
    return parallel_decode(vae, inputs, comm)


def _measure(name: str, vae, latents, comm, device: torch.device, reps: int) -> dict:
    """Peak memory of one decode or encode (which also warms up), then the median seconds of `reps` more."""
    from genbatch.parallel.vae import peak_memory

    with peak_memory(device) as peak:
        image = _run(name, vae, latents, comm)
    out = 0 if image is None else image.numel() * image.element_size()
    del image
    sent = comm.ledger.take()
    times, cpu = [], []
    for _ in range(reps):
        if comm.size > 1:
            dist.barrier(comm.group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, start_cpu = time.perf_counter(), time.thread_time()
        _run(name, vae, latents, comm)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return dict(
        seconds=statistics.median(times), cpu=statistics.median(cpu), peak=peak.bytes, sent=sum(sent.values()), out=out
    )


def bench(rank: int, world: int, opts: argparse.Namespace) -> dict[str, dict]:
    """This rank's numbers per VAE: 'p' for the decode over the whole world, 'one' for rank 0 decoding alone
    (measured first, while the others wait; only with `opts.one_rank_too`)."""
    from diffusers import AutoencoderKL, AutoencoderKLWan

    from genbatch.parallel.comm import Comm, CommLedger

    device = torch.device("cuda", rank % torch.cuda.device_count()) if opts.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    results = {}
    for name in opts.vae:
        torch.manual_seed(0)
        vae = (AutoencoderKL if name == "image" else AutoencoderKLWan)(**CONFIGS[name]).eval().to(device)
        latents = torch.randn(LATENTS[name], generator=torch.Generator().manual_seed(1)).to(device)
        if name == "wan-encode":
            latents = latents.clamp(-1, 1)  # pixels
        row = {}
        if opts.one_rank_too:
            if rank == 0:
                row["one"] = _measure(name, vae, latents, Comm(None, CommLedger()), device, opts.reps)
            dist.barrier()
        row["p"] = _measure(name, vae, latents, Comm(dist.group.WORLD, CommLedger()), device, opts.reps)
        results[name] = row
    return results


def report(ones: dict[str, dict], by_world: dict[int, list[dict[str, dict]]]) -> list[str]:
    """Lines comparing each world size (per-rank results) with the one-rank numbers `ones` (per VAE)."""
    lines = []
    for name, base in ones.items():
        lines.append(
            f"{name} {'pixels' if name == 'wan-encode' else 'latent'} {LATENTS[name]}: one rank {base['seconds']:.2f} s ({base['cpu']:.2f} s CPU), "
            f"peak {base['peak'] / 2**20:.1f} MiB"
        )
        for world, ranks in sorted(by_world.items()):
            rows = [per_rank[name]["p"] for per_rank in ranks]
            seconds, cpu = max(r["seconds"] for r in rows), max(r["cpu"] for r in rows)
            leader, others = rows[0]["peak"], max(r["peak"] for r in rows[1:])
            target = 1.25 / world * base["peak"] + rows[0]["out"]
            verdict = "meets" if max(leader, others) <= target else "MISSES"
            lines.append(
                f"  p={world}: {seconds:.2f} s ({seconds / base['seconds']:.2f}x one rank), "
                f"CPU {cpu:.2f} s/rank ({cpu / base['cpu']:.2f}x); "
                f"peak leader {leader / 2**20:.1f} MiB ({leader / base['peak']:.3f}x), "
                f"others {others / 2**20:.1f} MiB ({others / base['peak']:.3f}x), 1/p = {1 / world:.3f}; "
                f"sent {max(r['sent'] for r in rows) / 2**20:.2f} MiB/rank; "
                f"{verdict} 1.25/p * peak(1) + output = {target / 2**20:.1f} MiB"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="world sizes to spawn on CPU (besides 1)")
    parser.add_argument("--vae", nargs="+", choices=sorted(CONFIGS), default=["wan", "image", "wan-encode"])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--reps", type=int, default=1, help="timed decodes after the one measured for memory")
    opts = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun: rank 0 alone first, then the whole world
        dist.init_process_group("nccl" if opts.device == "cuda" else "gloo")
        opts.one_rank_too = True
        mine = bench(dist.get_rank(), dist.get_world_size(), opts)
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        if dist.get_rank() == 0:
            print("\n".join(report({name: row["one"] for name, row in ranks[0].items()}, {len(ranks): ranks})))
        dist.destroy_process_group()
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.support.distributed import run_on_ranks

    opts.one_rank_too = False
    ones = {name: row["p"] for name, row in run_on_ranks(bench, 1, (opts,), timeout_s=600)[0].items()}
    by_world = {world: run_on_ranks(bench, world, (opts,), timeout_s=600) for world in sorted(set(opts.worlds) - {1})}
    print("\n".join(report(ones, by_world)))


if __name__ == "__main__":
    main()
