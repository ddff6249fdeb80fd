"""PipeFusion and DistriFusion on the CPU: the quality of their outputs against exact, and PipeFusion's job time
against its formula, side by side in one run.

    python bench/pipefusion.py [--steps 10] [--seeds 2] [--delay 0.1] [--timing-steps 10] [--skip-quality]

Quality: for each tiny model (tiny-wan, tiny-flux, tiny-sd3) and stale layout, `gen run --nproc N` generates the
same jobs as an exact one-process `gen run`, and the PSNR and SSIM of the decoded outputs (PNG, MP4) against
the exact run's are printed (`genbatch.benchmark.quality.output_quality`, PSNR capped at its cap), with the
default warm-up of each method (PipeFusion 1 step, DistriFusion 4) and each layout's patches.

Timing: a fixed delay per layer makes the work of a forward known and independent of the machine: each block
of tiny Wan sleeps `delay x tokens / N` before it runs (a forward on a patch of N/M tokens sleeps 1/M as long),
so a step of the one-process run takes T = forwards x layers x delay and the stages overlap as they would on
devices of their own. The job time of PipeFusion over P stages with M patches and W warm-up steps is compared
with `W*T + (S-W)*T/P + (P-1)*T/(P*M)` (S steps), each ratio printed, and again with the fixed cost of a
forward added (embeddings, rotary tables, hooks: measured on the one-process run, paid by every patch forward
whatever its tokens), which the formula leaves out and a tiny CPU model makes large. Nothing is asserted; the numbers are for
the committed results (`bench/results/cpu/pipefusion.txt`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

QUALITY_LAYOUTS = {  # name: gen run flags (beyond --nproc)
    "distrifusion2": ("--distrifusion", "2"),
    "pipefusion2-patches2": ("--pipefusion", "2"),
    "pipefusion2-patches4": ("--pipefusion", "2", "--patches", "4"),
    "pipefusion2-ulysses2": ("--pipefusion", "2", "--ulysses", "2"),
}
MODELS = ("tiny-wan", "tiny-flux", "tiny-sd3")


def _gen(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "genbatch", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gen {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def quality(opts) -> None:
    from genbatch.benchmark.quality import output_quality
    from tests.support.runs import write_manifest

    print(f"quality: PSNR / SSIM of the decoded outputs against exact ({opts.seeds} seeds, {opts.steps} steps)")
    print(f"{'model':10s} {'layout':22s} {'ranks':>5s} {'PSNR dB':>8s} {'SSIM':>7s}")
    with tempfile.TemporaryDirectory() as root:
        for model in MODELS:
            rows = [{"id": f"seed-{seed}", "prompt": "a red fox running through snow", "seed": seed,
                     "num_inference_steps": opts.steps} for seed in range(opts.seeds)]
            manifest = write_manifest(os.path.join(root, f"{model}.parquet"), rows)
            exact = os.path.join(root, model, "exact")
            _gen("run", manifest, "--out", exact, "--model", model, "-q")
            for name, flags in QUALITY_LAYOUTS.items():
                if "--ulysses" in flags and model == "tiny-sd3":
                    continue  # its tiny config's heads do not split over 2 Ulysses ranks here
                ranks = 1
                for flag, value in zip(flags[::2], flags[1::2], strict=True):
                    ranks *= int(value) if flag in ("--distrifusion", "--pipefusion", "--ulysses") else 1
                out = os.path.join(root, model, name)
                _gen("run", manifest, "--out", out, "--model", model, "--nproc", str(ranks), *flags, "-q")
                scores = output_quality(exact, out)
                print(f"{model:10s} {name:22s} {ranks:5d} {scores['psnr_db']:8.2f} {scores['ssim']:7.4f}", flush=True)


def _timed_rank(rank, world_size, out, layout, patches, steps, delay, warmup):
    import torch

    from genbatch.parallel.stale import PIPEFUSION, StaleConfig
    from genbatch.runner.timing import JobTimer
    from tests.support import executor as drive
    from tests.support.runs import job, job_executor

    with job_executor(out, **layout) as (world, executor):
        work = job("tiny-wan", num_inference_steps=steps, seed=1)
        tokens = executor.model_for(work).spec.tokens(work.width, work.height, work.num_frames)
        pipe = executor.model_for(work).pipe

        def sleep(block, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            time.sleep(delay * hidden.shape[1] * max(world.ctx.sp.size, 1) / tokens)

        hooks = [block.register_forward_pre_hook(sleep, with_kwargs=True) for block in pipe.transformer.blocks]
        if layout.get("pp", 1) > 1:
            drive.use_stale(executor, StaleConfig(method=PIPEFUSION, patches=patches, warmup_steps=warmup))
        drive.denoise(executor, work, JobTimer(world.ctx.device))  # warm: the first job pays the allocations
        if world.ctx.distributed:
            torch.distributed.barrier()
        started = time.perf_counter()
        drive.denoise(executor, work, JobTimer(world.ctx.device))
        seconds = time.perf_counter() - started
        for hook in hooks:
            hook.remove()
        return seconds, len(pipe.transformer.blocks)


def timing(opts) -> None:
    from tests.support.distributed import run_on_ranks

    steps, delay, warmup = opts.timing_steps, opts.delay, 1
    with tempfile.TemporaryDirectory() as root:
        single, layers = _timed_rank(0, 1, os.path.join(root, "single"), {}, 1, steps, delay, warmup)
        forwards = 2  # tiny Wan runs both CFG branches a step
        step = forwards * layers * delay  # T: the one-device step time the delays make
        print(f"\ntiming: tiny Wan, {layers} layers x {delay * 1000:.0f} ms a forward, {forwards} forwards a step, "
              f"S={steps} steps, W={warmup}; T={step:.3f} s, one process {single:.2f} s a job "
              f"({single / (steps * step):.3f} of S*T)")
        overhead = (single - steps * step) / (steps * forwards)  # per forward, beside the delays: embeddings, hooks
        print(f"each forward also costs {overhead * 1000:.1f} ms beside its delays (one process), whatever its tokens")
        print(f"{'P':>2s} {'M':>2s} {'measured s':>10s} {'formula s':>9s} {'ratio':>6s} {'+overhead s':>11s} "
              f"{'ratio':>6s} {'speedup':>7s}")
        for stages, patches in ((2, 2), (2, 4)):
            results = run_on_ranks(_timed_rank, stages, args=(os.path.join(root, f"pp{stages}m{patches}"),
                                                              {"pp": stages}, patches, steps, delay, warmup),
                                   timeout_s=120)
            measured = max(seconds for seconds, _ in results)
            formula = warmup * step + (steps - warmup) * step / stages + (stages - 1) * step / (stages * patches)
            # a stage runs every forward of the job: whole ones in the warm-up, one per patch after it
            counted = formula + overhead * forwards * (warmup + (steps - warmup) * patches)
            print(f"{stages:2d} {patches:2d} {measured:10.3f} {formula:9.3f} {measured / formula:6.3f} "
                  f"{counted:11.3f} {measured / counted:6.3f} {single / measured:7.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="Denoising steps of the quality jobs.")
    parser.add_argument("--seeds", type=int, default=2, help="Jobs (seeds) per model for quality.")
    parser.add_argument("--delay", type=float, default=0.1, help="Seconds a layer sleeps per whole forward.")
    parser.add_argument("--timing-steps", type=int, default=10, help="Denoising steps of the timed job.")
    parser.add_argument("--skip-quality", action="store_true", help="Only the timing part.")
    opts = parser.parse_args()
    if not opts.skip_quality:
        quality(opts)
    timing(opts)


if __name__ == "__main__":
    main()
