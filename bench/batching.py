"""Batched rows (`gen run --batch-size N`) side by side in one process: jobs per hour at N = 1, 2, 4 and 8, and the
text encode's seconds per job with 1 and with 8 seeds per prompt.

    python bench/batching.py [--sizes 1 2 4 8] [--jobs 8] [--steps 2] [--rounds 2] [--cases flux-256 sd3-512]
                             [--threads N] [--cache-dir DIR]
    python bench/batching.py --cases flux.1-dev-512 flux.1-dev-1024 --steps 4   # a GPU (bench/gpu.sh step 6)

Two image families at their real transformer widths, random weights, few blocks (the width sets a step's GEMM
shapes, which is what batching changes; the depth only multiplies):
    flux-256   FLUX.1-dev's width (24 heads x 128 = 3072, 1 dual- and 2 single-stream blocks), 256 x 256:
               256 image tokens
    sd3-512    SD3's width (24 heads x 64 = 1536, 2 joint blocks), 512 x 512: 1024 image tokens, CFG (two
               forwards a step)
Both have CLIP-L and T5-XXL text encoders at their real widths (768, 4096) with 2 layers each, and the tiny
presets' narrow VAE (8 channels, 4 levels: a real VAE's scale factor, its decode a small part of a job).
On a GPU, FLUX.1-dev's whole architecture (the `flux.1-dev-random` bench model, 12B, bf16, its real VAE):
    flux.1-dev-512    512 x 512 at batch 1, 4 and 16 (16 jobs)     the sizes SGLang measured Qwen-Image at on an
    flux.1-dev-1024   1024 x 1024 at batch 1 and 2 (4 jobs)        H200: 3.21x at batch 16 at 512, 1.02x at 2 at 1024
and `tiny-flux` (the preset, 64 x 64, batch 1 and 2: what `bench/gpu.sh --device cpu --tiny` runs in the tests).

Each case's pipeline is saved with save_pretrained and run from its directory through genbatch's executor
(`JobExecutor.generate_batch`: encode, denoise in one forward per step for the batch, decode row by row) and
the PNG encode, for `--jobs` jobs of distinct prompts cut into batches of N. The sizes run in the order
1 2 4 8 8 4 2 1 ... (`--rounds` passes each way), so a drift of the machine's speed falls on every size alike;
each size's figure is the mean of its passes. Prompts are encoded once before the passes (the embedding cache
then holds them, as it does for prompts that repeat), so the jobs per hour are the denoise's, decode's and
PNG's; the encode is measured apart, with the cache emptied first: `--jobs` rows of distinct prompts, then
`--jobs` rows of one prompt with as many seeds. Nothing is asserted; the printed lines are the committed
results (bench/results/cpu/batching.txt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CASES = {
    "flux-256": dict(family="flux", size=256, transformer=dict(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=2, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56)), guidance=3.5),
    "sd3-512": dict(family="sd3", size=512, transformer=dict(
        sample_size=64, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=64, num_attention_heads=24,
        caption_projection_dim=1536, joint_attention_dim=4096, pooled_projection_dim=1536, out_channels=16,
        pos_embed_max_size=96), guidance=5.0),
    "tiny-flux": dict(family="flux", size=64, preset="tiny-flux", guidance=3.5, sizes=[1, 2], jobs=2),
    "flux.1-dev-512": dict(family="flux", size=512, bench_model="flux.1-dev-random", guidance=3.5, sizes=[1, 4, 16],
                           jobs=16),
    "flux.1-dev-1024": dict(family="flux", size=1024, bench_model="flux.1-dev-random", guidance=3.5, sizes=[1, 2],
                            jobs=4),
}
PROMPTS = ["a lighthouse on a cliff at dawn", "a bowl of ramen, steam rising", "two cats asleep on a red sofa",
           "a city street in the rain at night", "an owl on a snowy branch", "a sailing boat in a storm",
           "a field of sunflowers under a blue sky", "a robot reading a newspaper", "a glass of milk on a table",
           "a mountain village at sunset", "a fox in tall grass", "a castle made of sand", "a neon diner at 3 am",
           "a hot air balloon over a canyon", "a forest path in autumn", "an old map on a wooden desk"]


def _build(case: dict):
    import torch
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                           SD3Transformer2DModel, StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from genbatch.benchmark.models import FLUX1_CLIP, FLUX1_T5  # CLIP-L and T5-XXL at their widths, 2 layers
    from genbatch.models import tiny_configs
    from genbatch.models.tiny import character_tokenizer

    def seeded(seed, make):
        torch.manual_seed(seed)
        return make().eval()

    clip_tokenizer, t5_tokenizer = character_tokenizer(model_max_length=77), character_tokenizer(model_max_length=512)
    clip = CLIPTextConfig(vocab_size=len(clip_tokenizer), **FLUX1_CLIP)
    t5 = seeded(1, lambda: T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), **FLUX1_T5)))
    vae = seeded(3, lambda: AutoencoderKL(**tiny_configs.TINY_FLUX_VAE))
    if case["family"] == "flux":
        scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                                    max_shift=1.15, use_dynamic_shifting=True, shift=3.0)
        return FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=seeded(0, lambda: CLIPTextModel(clip)),
                            tokenizer=clip_tokenizer, text_encoder_2=t5, tokenizer_2=t5_tokenizer,
                            transformer=seeded(2, lambda: FluxTransformer2DModel(**case["transformer"])))
    sd3_vae = seeded(3, lambda: AutoencoderKL(**tiny_configs.TINY_SD3_VAE))
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=sd3_vae,
        text_encoder=seeded(10, lambda: CLIPTextModelWithProjection(clip)), tokenizer=clip_tokenizer,
        text_encoder_2=seeded(11, lambda: CLIPTextModelWithProjection(clip)),
        tokenizer_2=character_tokenizer(model_max_length=77), text_encoder_3=t5,
        tokenizer_3=character_tokenizer(model_max_length=256),
        transformer=seeded(13, lambda: SD3Transformer2DModel(**case["transformer"])))


def _saved(name: str, cache_dir: str) -> str:
    if "preset" in CASES[name]:
        return CASES[name]["preset"]
    if "bench_model" in CASES[name]:  # built once (on the GPU when there is one) and shared with gen bench
        from genbatch.benchmark.models import MODELS, materialize

        return materialize(MODELS[CASES[name]["bench_model"]])
    path = os.path.join(cache_dir, name)
    if not os.path.exists(os.path.join(path, "model_index.json")):
        _build(CASES[name]).save_pretrained(path)
    return path


def _executor(model: str, out: str):
    from genbatch.io import BackgroundWriter, RunStore
    from genbatch.runner.options import RunOptions
    from genbatch.runner.startup import build_executor
    from genbatch.runner.world import start_world

    options = RunOptions.from_flags("unused", out, {"model": model, "quiet": True})
    world = start_world(options)
    return world, build_executor(options, world, RunStore(out), BackgroundWriter(max_pending=1), run_id="bench")


def _jobs(model: str, case: dict, count: int, steps: int, one_prompt: bool = False):
    from genbatch.jobs.spec import JobSpec

    base = JobSpec(id="job", prompt=PROMPTS[0], negative_prompt="blurry" if case["family"] == "sd3" else None,
                   model=model, width=case["size"], height=case["size"], num_frames=None,
                   num_inference_steps=steps, guidance_scale=case["guidance"], seed=0, fps=None, row=0)
    return [replace(base, id=f"job-{index}", prompt=PROMPTS[0 if one_prompt else index % len(PROMPTS)], seed=index,
                    row=index) for index in range(count)]


def _pass(world, executor, jobs, size: int) -> dict:
    """Every job once in batches of `size`: wall seconds, and the denoise steps' seconds."""
    from genbatch.io import encode_png
    from genbatch.jobs.prepared import PreparedJob  # rows without images or adapters: nothing to prepare
    from genbatch.models.hooks import to_uint8
    from genbatch.runner.timing import JobTimer

    start, denoise = time.perf_counter(), 0.0
    for first in range(0, len(jobs), size):
        timer = JobTimer(world.ctx.device)
        for row in executor.generate_batch([PreparedJob.of(job) for job in jobs[first : first + size]], timer):
            encode_png(to_uint8(row.frames))
        denoise += sum(row["seconds"] for row in timer.rows() if row["stage"] == "denoise_step")
    return {"wall": time.perf_counter() - start, "denoise": denoise}


def _encode_seconds(world, executor, jobs) -> float:
    """Text-encode seconds per job for `jobs` (batches of one, one step each), the embedding cache emptied first."""
    from genbatch.jobs.prepared import PreparedJob
    from genbatch.runner.timing import JobTimer

    executor.embeddings.clear()
    total = 0.0
    for job in jobs:
        timer = JobTimer(world.ctx.device)
        executor.generate_batch([PreparedJob.of(replace(job, num_inference_steps=1))], timer)
        total += sum(row["seconds"] for row in timer.rows() if row["stage"] == "text_encode")
    return total / len(jobs)


def _case(name: str, opts) -> list[str]:
    import tempfile

    case = CASES[name]
    model = _saved(name, opts.cache_dir)
    sizes, count = opts.sizes or case.get("sizes", [1, 2, 4, 8]), opts.jobs or case.get("jobs", 8)
    lines = []
    with tempfile.TemporaryDirectory() as out:
        world, executor = _executor(model, out)
        try:
            jobs = _jobs(model, case, count, opts.steps)
            _pass(world, executor, jobs, 1)  # warm-up; encodes every prompt into the cache
            passes: dict[int, list[dict]] = {size: [] for size in sizes}
            for _ in range(opts.rounds):
                for order in (sizes, list(reversed(sizes))):
                    for size in order:
                        passes[size].append(_pass(world, executor, jobs, size))
            base = None
            for size in sizes:
                wall = statistics.mean(run["wall"] for run in passes[size]) / len(jobs)
                denoise = statistics.mean(run["denoise"] for run in passes[size]) / len(jobs)
                base = base or (wall, denoise)
                lines.append(f"{name} N={size}: {3600 / wall:7.1f} jobs/h ({wall:6.2f} s a job, denoise "
                             f"{denoise:6.2f} s), x{base[0] / wall:.2f} jobs/h and x{base[1] / denoise:.2f} denoise "
                             f"throughput vs N=1")
            distinct = _encode_seconds(world, executor, _jobs(model, case, max(sizes), 1))
            shared = _encode_seconds(world, executor, _jobs(model, case, max(sizes), 1, one_prompt=True))
            lines.append(f"{name} text encode: {distinct:.3f} s a job with 1 seed per prompt, {shared:.3f} s with "
                         f"{max(sizes)} seeds per prompt (x{distinct / shared:.1f})")
        finally:
            executor.stop.restore()
            world.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="batch sizes (default: the case's, "
                        "1 2 4 8 on the CPU cases)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per pass, a multiple of every size (default: "
                        "the case's, 8 on the CPU cases)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="passes each way (1: 1 2 4 8 8 4 2 1)")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["flux-256", "sd3-512"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "genbatch-bench-batching"))
    opts = parser.parse_args()
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"bench/batching.py: torch {torch.__version__}, {device}, {opts.steps} steps, {opts.rounds} round(s) each "
          "way", flush=True)
    for name in opts.cases:
        for line in _case(name, opts):
            print(line, flush=True)


if __name__ == "__main__":
    from genbatch.parallel.teardown import exit_process

    main()
    exit_process(0, skip_finalization=True)  # every line is printed: no finalization to crash
