"""`--compile` on the CPU: a Wan block stack eager against compiled (inductor), side by side, and compile times.

    python bench/compile.py [--layers 10] [--heads 12] [--frames 9] [--size 256] [--rounds 2] [--threads 2]

Builds a random-weight `WanTransformer3DModel` (genbatch compiles it as `gen run --compile` does: each block's
forward, through `genbatch.parallel.compile.compile_units` with the Wan plan's units) and prints:
- seconds per step (one transformer forward) eager and compiled, in A B B A rounds in one process, and the
  ratio eager / compiled (target on this CPU: at least 1.1);
- the cold compile (an empty TORCHINDUCTOR_CACHE_DIR) and two warm ones, each in a fresh process: from
  genbatch's artifacts (`genbatch.runner.compile_cache.CompileCache`, what a requeued `gen run --compile`
  loads) with another empty TORCHINDUCTOR_CACHE_DIR, so the reuse provably comes from them (target: at most
  25% of the cold compile), and from inductor's own local cache (the cold run's cache directory);
- where the eager step's time goes (torch.profiler: matmuls and attention, which compiling leaves as they
  are, against the rest, which inductor fuses): the ceiling of the speed-up.
Nothing is asserted: the numbers are for the committed results (`bench/results/cpu/compile.txt`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(opts):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=opts.heads, attention_head_dim=64, in_channels=16,
        out_channels=16, text_dim=256, freq_dim=256, ffn_dim=4 * 64 * opts.heads, num_layers=opts.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    ).eval()


def _inputs(opts):
    import torch

    gen = torch.Generator().manual_seed(1)
    latent_frames, side = (opts.frames - 1) // 4 + 1, opts.size // 8
    # (b, c, f, h, w) latents; (b, text tokens, text_dim) prompt embeddings
    return {"hidden_states": torch.randn(1, 16, latent_frames, side, side, generator=gen),
            "encoder_hidden_states": torch.randn(1, 64, 256, generator=gen),
            "timestep": torch.tensor([500.0]), "return_dict": False}


def _compiled(model):
    from genbatch.models import family
    from genbatch.parallel.compile import CompileConfig, compile_units

    plan = family("wan").transformer_parts(type(model).__name__)
    compile_units(model, plan.compile_units, CompileConfig(backend="inductor"))
    return model


def _step(model, inputs) -> float:
    import torch

    start = time.perf_counter()
    with torch.no_grad():
        model(**inputs)
    return time.perf_counter() - start


def child_compile(opts) -> dict:
    """In a fresh process: load genbatch's artifacts (`--artifacts` holding them), build, compile, run twice,
    and save the artifacts when none were loaded; the compile seconds (dynamo's callbacks) and the steps."""
    import torch

    from genbatch.parallel.compile import CLOCK
    from genbatch.runner.compile_cache import CompileCache

    torch.set_num_threads(opts.threads)
    cache = CompileCache(url=opts.artifacts, name="bench.tar.gz") if opts.artifacts else None
    loaded = cache.load() if cache is not None else False
    model, inputs = _compiled(_model(opts)), _inputs(opts)
    first = _step(model, inputs)
    second = _step(model, inputs)
    if cache is not None:
        cache.save()
    return {"compile_s": sum(event.seconds for event in CLOCK.take()), "first_step_s": first, "step_s": second,
            "loaded": loaded}


def time_shares(opts) -> dict:
    """Shares of one eager step's CPU time: matmuls, attention, everything else (elementwise, norms, copies)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(opts.threads)
    model, inputs = _model(opts), _inputs(opts)
    _step(model, inputs)
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        model(**inputs)
    shares = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        if event.key in ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear"):
            if event.key in ("aten::addmm", "aten::mm", "aten::bmm"):
                shares["matmul"] += event.self_cpu_time_total
        elif "scaled_dot_product" in event.key:
            shares["attention"] += event.self_cpu_time_total
        else:
            shares["other"] += event.self_cpu_time_total
    total = sum(shares.values())
    return {key: value / total for key, value in shares.items()}


def side_by_side(opts) -> dict:
    """Eager and compiled copies of one model in one process, A B B A rounds of `--steps` steps each."""
    import copy

    import torch

    torch.set_num_threads(opts.threads)
    eager = _model(opts)
    compiled = _compiled(copy.deepcopy(eager))
    inputs = _inputs(opts)
    _step(compiled, inputs)  # the compile, outside the rounds
    _step(eager, inputs)
    times = {"eager": [], "compiled": []}
    for _ in range(opts.rounds):
        for name in ("eager", "compiled", "compiled", "eager"):
            model = eager if name == "eager" else compiled
            times[name] += [_step(model, inputs) for _ in range(opts.steps)]
    with torch.no_grad():
        diff = float((eager(**inputs)[0] - compiled(**inputs)[0]).abs().max())
    return {name: statistics.median(values) for name, values in times.items()} | {"max_abs_diff": diff}


def _child(opts, cache: str, artifacts: str = "") -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(opts.threads)}
    args = [sys.executable, __file__, "--child", f"--artifacts={artifacts}",
            *[f"--{k}={v}" for k, v in _shape_args(opts).items()]]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shape_args(opts) -> dict:
    return {"layers": opts.layers, "heads": opts.heads, "frames": opts.frames, "size": opts.size,
            "threads": opts.threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child_compile(opts)))
        return
    tokens = ((opts.frames - 1) // 4 + 1) * (opts.size // 16) ** 2
    print(f"Wan block stack: {opts.layers} blocks, {opts.heads} heads x 64, {tokens} tokens "
          f"({opts.frames} frames at {opts.size}^2), fp32, {opts.threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second, \
            tempfile.TemporaryDirectory() as artifacts:
        cold = _child(opts, first, artifacts)  # empty inductor cache; saves genbatch's artifacts
        warm = _child(opts, second, artifacts)  # another empty inductor cache; loads them
        local = _child(opts, first)  # inductor's own cache from the cold run, no artifacts
    assert not cold["loaded"] and warm["loaded"]
    print(f"compile (inductor, every block class), each in a fresh process: cold {cold['compile_s']:.1f} s; "
          f"warm from genbatch's artifacts (empty TORCHINDUCTOR_CACHE_DIR) {warm['compile_s']:.1f} s: "
          f"warm/cold {warm['compile_s'] / cold['compile_s']:.2f}; warm from inductor's local cache "
          f"{local['compile_s']:.1f} s: {local['compile_s'] / cold['compile_s']:.2f}")
    print(f"first step incl. compile: cold {cold['first_step_s']:.1f} s, warm {warm['first_step_s']:.1f} s")
    shares = time_shares(opts)
    print("eager step time: " + ", ".join(f"{key} {value:.0%}" for key, value in shares.items())
          + " (compiling fuses only the 'other' part)")
    result = side_by_side(opts)
    print(f"seconds per step (median, {opts.rounds} A B B A rounds of {opts.steps} steps): eager "
          f"{result['eager']:.3f}, compiled {result['compiled']:.3f}: eager/compiled "
          f"{result['eager'] / result['compiled']:.2f}x; max abs diff {result['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main()
