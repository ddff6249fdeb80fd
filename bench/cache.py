"""Step caching on the CPU: a Wan block stack of real width, every mode side by side in one process.

    python bench/cache.py [--layers 4] [--heads 12] [--steps 8] [--frames 5] [--size 128] [--threads 1] [--rounds 3]
                          [--modes none,fbc:0.05,fbc:0.1,fbc:0.2,fbc:0.4,taylorseer:2,taylorseer:3,teacache:0,teacache:0.2]

Builds a random-weight `WanTransformer3DModel` of Wan 2.1 1.3B's width (12 heads of 128, FFN 8960) with a few
blocks, and denoises one job of `--steps` steps with CFG (two branches a step, UniPC flow scheduler, the
loop of `genbatch.runner.denoise`) once per mode, each through genbatch's own `StepCache` (the hooks `gen run
--cache` installs, each branch in its cache context). For each mode it prints the seconds per job, the branch
forwards skipped, the seconds the skipped work predicts (the uncached job's seconds times the share of the
work done: a skipped FBC forward still runs block 0, 1/layers of the blocks; a predicted TaylorSeer forward
runs none of its attention and feed-forward work; a skipped TeaCache forward runs no block), and the PSNR of the final latents against the uncached
run's. Measured against predicted shows the hooks' and decisions' overhead, and that the time saved follows
the forwards skipped. Modes run in A B A order
(`--rounds`), the first exact run warms up.

TeaCache runs with Wan 2.1 T2V 1.3B's published coefficients and warm-up (5 steps), given to the stack
explicitly: it is 1.3B's width but not its depth, so `gen run` would not recognise it as a covered model.

Random weights do not give real skip rates or real quality: a trained model's first-block residual (and
its timestep embedding's rescaled change) moves differently from step to step. What this measures is the mechanism: its overhead, its accounting, and that
the time saved follows the forwards skipped. Nothing is asserted; the numbers are for the committed results
(`bench/results/cpu/cache.txt`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MODES = "none,fbc:0.05,fbc:0.1,fbc:0.2,fbc:0.4,taylorseer:2,taylorseer:3,teacache:0,teacache:0.2"


def _model(opts):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=opts.heads, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=opts.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    ).eval()


def _job(opts):
    import torch

    gen = torch.Generator().manual_seed(1)
    latent_frames, side = (opts.frames - 1) // 4 + 1, opts.size // 8
    # (b, c, f, h, w) noise; (b, text tokens, 4096) UMT5 embeddings for each branch
    return {"latents": torch.randn(1, 16, latent_frames, side, side, generator=gen),
            "cond": torch.randn(1, 64, 4096, generator=gen), "uncond": torch.randn(1, 64, 4096, generator=gen)}


def _stack_coefficients():
    """TeaCache covers this stack, with Wan 2.1 T2V 1.3B's published coefficients, while the job starts."""
    import dataclasses
    from unittest import mock

    from genbatch.models import teacache

    wan = next(model for model in teacache.COVERED if model.name == "Wan 2.1 T2V 1.3B")
    stack = dataclasses.replace(wan, name="the bench's Wan stack (1.3B's coefficients)", config=())
    return mock.patch.object(teacache, "COVERED", (stack, *teacache.COVERED))


def _denoise(model, inputs, mode: str, steps: int):
    """(final latents, seconds, branch forwards skipped) of one job under `mode`."""
    import torch
    from diffusers import UniPCMultistepScheduler

    from genbatch.jobs.cache import parse_cache
    from genbatch.models import resolve_model
    from genbatch.parallel.cache.session import SKIPPED, StepCache
    from genbatch.parallel.comm import Comm, CommLedger

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(steps)
    latents = inputs["latents"].clone()
    with _stack_coefficients():
        cache = StepCache.start(SimpleNamespace(transformer=model), resolve_model("tiny-wan"), parse_cache(mode),
                                Comm(None, CommLedger()), steps=steps)
    skipped = 0
    started = time.perf_counter()
    with torch.no_grad():
        for index, t in enumerate(scheduler.timesteps):
            predictions = {}
            for branch in ("cond", "uncond"):
                with cache.branch(branch, index):
                    predictions[branch] = model(hidden_states=latents, timestep=t.expand(1), return_dict=False,
                                                encoder_hidden_states=inputs[branch])[0]
            noise = predictions["uncond"] + 5.0 * (predictions["cond"] - predictions["uncond"])
            latents = scheduler.step(noise, t, latents, return_dict=False)[0]
            skipped += cache.step_columns(False, None, latents.device).get(SKIPPED, 0)
    seconds = time.perf_counter() - started
    cache.close()
    return latents, seconds, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the modes (every other one in reverse)")
    parser.add_argument("--modes", default=MODES)
    opts = parser.parse_args()
    import torch

    from genbatch.benchmark.quality import psnr

    torch.set_num_threads(opts.threads)
    model, inputs = _model(opts), _job(opts)
    modes = opts.modes.split(",")
    tokens = inputs["latents"].shape[2] * (inputs["latents"].shape[3] // 2) * (inputs["latents"].shape[4] // 2)
    print(f"Wan block stack: {opts.layers} blocks, {opts.heads} heads x 128, FFN 8960 "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, random weights), {tokens} video "
          f"tokens, {opts.steps} steps x 2 branches, {opts.threads} threads")
    _denoise(model, inputs, "none", opts.steps)  # warm-up: one whole job
    exact = None
    results = {mode: [] for mode in modes}
    order = [mode for round_ in range(opts.rounds) for mode in (modes if round_ % 2 == 0 else modes[::-1])]
    for mode in order:
        latents, seconds, skipped = _denoise(model, inputs, mode, opts.steps)
        if mode == "none" and exact is None:
            exact = latents
        results[mode].append((latents, seconds, skipped))
    forwards = 2 * opts.steps
    base = min(seconds for _, seconds, _ in results["none"])
    print(f"\n{'mode':<16}{'s/job':>9}{'vs none':>9}{'skipped':>10}{'predicted s':>13}{'PSNR dB':>10}")
    for mode in modes:
        seconds = min(s for _, s, _ in results[mode])
        latents, _, skipped = results[mode][0]
        assert all(run[2] == skipped for run in results[mode])  # the same decisions every round
        left = 1 / opts.layers if mode.startswith("fbc") else 0.0  # the work a skipped forward still does
        predicted = base * (forwards - skipped + skipped * left) / forwards
        value = psnr(latents.numpy(), exact.numpy(), peak=float(exact.max() - exact.min()))
        print(f"{mode:<16}{seconds:>9.2f}{base / seconds:>8.2f}x{skipped:>5}/{forwards:<4}"
              f"{predicted:>13.2f}{value:>10.1f}")
    print("\ns/job: the fastest of the rounds. skipped: branch forwards that reused cached work (FBC: every block "
          "after the first; TaylorSeer: attention and feed-forward predicted; TeaCache: every block, after 5 "
          "warm-up steps, the last step computed). predicted s: none's s/job times "
          "the share of the work done. PSNR: final latents against none's. Random weights: the skip rates and "
          "PSNR are not a trained model's; the overhead and the time saved per forward skipped are what this "
          "measures.")


if __name__ == "__main__":
    main()
