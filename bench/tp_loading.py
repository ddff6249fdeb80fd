"""Tensor-parallel loading's memory per rank: each rank reads only its shards, against loading whole then splitting.

    python bench/tp_loading.py [--tp 2] [--modes shards whole] [--cache DIR]

The real-size Wan 2.1 T2V 1.3B transformer (`wan2.1-1.3b-random` of `genbatch.benchmark.models`: the real
config, random weights saved once in bf16 by `materialize`) is loaded by `--tp` gloo processes on the CPU, in
bf16 (its `_keep_in_fp32_modules` in fp32), and split over tp by its family's tensor splits:

    shards  genbatch's `--tp` path from a directory: the transformer built with its parameters on the meta
            device, split, then each rank reads its own blocks from the safetensors (`parallel.tensor.checkpoint`)
    whole   loading whole with diffusers' `from_pretrained`, then splitting (what every rank did before)

Each rank's anonymous memory (RssAnon of /proc/self/status: file pages safetensors maps do not count) is taken
after the imports, the process group and the mesh (the baseline), then after loading (steady) and at its
highest while loading (peak, sampled every 2 ms), both above the baseline. They are printed against the size of
the weights in their load dtypes, with the target at tp 2 of 0.55 of the weights plus one layer (one
transformer block, whole).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
import types

GiB = 2**30


def rss_anon(field: str = "RssAnon") -> int:
    """This process's anonymous resident memory in bytes (RssAnon; `field="RssFile"`: its resident file pages)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


class PeakSampler:
    """The highest RssAnon seen by a thread sampling every `interval_s` seconds while in the `with` block."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.peak = rss_anon()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def _load(mode: str, path: str, ctx, spec, dtype):
    """The transformer of the pipeline directory `path`, split over tp, loaded by `mode`."""
    from genbatch.parallel.apply import apply_tensor_parallel
    from genbatch.parallel.tensor.checkpoint import fill_from_safetensors
    from genbatch.runner.loading import empty_component

    if mode == "shards":
        model = empty_component(path, "transformer", dtype)
        apply_tensor_parallel(types.SimpleNamespace(transformer=model), spec, ctx)
        fill_from_safetensors(model, os.path.join(path, "transformer"), dtype, ctx.device,
                              keep_fp32=model._keep_in_fp32_modules)
        return model
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(path, subfolder="transformer", torch_dtype=dtype,
                                                  local_files_only=True).eval()
    apply_tensor_parallel(types.SimpleNamespace(transformer=model), spec, ctx)
    return model


def _full_bytes(module) -> int:
    """Bytes of `module`'s parameters and buffers whole (a DTensor's global size) in their dtypes."""
    import itertools

    return sum(t.numel() * t.element_size() for t in itertools.chain(module.parameters(), module.buffers()))


def bench(rank: int, world: int, mode: str, path: str) -> dict:
    import torch
    from diffusers import WanTransformer3DModel  # noqa: F401 - imported before the baseline

    from genbatch.models import resolve_model
    from genbatch.parallel.context import build_context
    from genbatch.parallel.dims import ParallelDims

    ctx = build_context(ParallelDims(tp=world), torch.device("cpu"))
    spec = resolve_model(path)
    gc.collect()
    baseline, baseline_file = rss_anon(), rss_anon("RssFile")
    started = time.perf_counter()
    with PeakSampler() as sampler:
        model = _load(mode, path, ctx, spec, torch.bfloat16)
        gc.collect()
    seconds = time.perf_counter() - started
    steady = rss_anon()
    return dict(rank=rank, mode=mode, seconds=seconds, baseline=baseline, steady=steady - baseline,
                file=rss_anon("RssFile") - baseline_file,
                peak=sampler.peak - baseline, weights=_full_bytes(model), layer=_full_bytes(model.blocks[0]))


def report(rows: list[dict], tp: int, commit: str) -> list[str]:
    weights, layer = rows[0]["weights"], rows[0]["layer"]
    target = 0.55 * weights + layer
    lines = [f"tensor-parallel loading, Wan 2.1 T2V 1.3B transformer (random bf16 weights), tp {tp}, gloo on "
             f"the CPU, at {commit} (load average {os.getloadavg()[0]:.1f})",
             f"weights {weights / GiB:.3f} GiB in their load dtypes; one layer {layer / GiB:.3f} GiB; target "
             f"0.55 x weights + one layer = {target / GiB:.3f} GiB ({target / weights:.3f} of the weights)",
             "RssAnon above an import-and-mesh baseline, per rank:",
             f"{'mode':<7} {'rank':>4} {'steady GiB':>10} {'/weights':>8} {'peak GiB':>9} {'/weights':>8} "
             f"{'load s':>7} {'target':>7} {'file GiB':>8}"]
    for row in rows:
        verdict = "met" if row["steady"] <= target else "MISSED"
        lines.append(f"{row['mode']:<7} {row['rank']:>4} {row['steady'] / GiB:>10.3f} {row['steady'] / weights:>8.3f} "
                     f"{row['peak'] / GiB:>9.3f} {row['peak'] / weights:>8.3f} {row['seconds']:>7.1f} {verdict:>7} "
                     f"{row['file'] / GiB:>8.3f}")
    lines.append("file GiB: pages of the safetensors still mapped after loading (RssFile above the baseline), not "
                 "counted: `shards` copies every part it reads and lets the mapping go; diffusers' `whole` keeps "
                 "tensors as views of it")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (gloo processes)")
    parser.add_argument("--modes", nargs="+", choices=("shards", "whole"), default=["shards", "whole"])
    parser.add_argument("--cache", default=None, help="where the saved model lives (default: genbatch's bench cache)")
    opts = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import subprocess

    from genbatch.benchmark.models import MODELS, materialize
    from tests.support.distributed import run_on_ranks

    path = materialize(MODELS["wan2.1-1.3b-random"], opts.cache)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "an unknown commit"
    rows = [row for mode in opts.modes for row in run_on_ranks(bench, opts.tp, (mode, path), timeout_s=900)]
    print("\n".join(report(rows, opts.tp, commit)))


if __name__ == "__main__":
    main()
