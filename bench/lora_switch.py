"""What a LoRA switch costs against a job, on the CPU: a Wan block stack of real width, side by side in one process.

    python bench/lora_switch.py [--layers 4] [--rank 64] [--steps 8] [--frames 5] [--size 128] [--threads 1] [--rounds 3]

Builds a random-weight `WanTransformer3DModel` of Wan 2.1 1.3B's width (12 heads of 128, FFN 8960) with a few
blocks, and two random adapters in the original Wan layout the LightX2V LoRAs use (`diffusion_model.blocks.N.
self_attn.q.lora_down.weight`, ...) on every attention projection and both feed-forward Linears of every block,
at `--rank`. Each goes through genbatch's own path, as `gen run` takes it: `Adapters.plan` (read under the
media policy, converted by diffusers' `WanPipeline.lora_state_dict`, checked against the model, once per
adapter: "prepare") and `AdapterSwitch.apply` (base + the set's deltas written in place: "switch").

It prints the seconds of: preparing an adapter; the first switch (it also keeps the base weights on the host);
the later switches (A to B, B to none, none to A); a job of `--steps` steps with CFG (two forwards a step, the
UniPC flow scheduler); and a few-step job (4 steps, one forward each: a distilled LoRA's recipe). Then each
switch as a share of each job. Switch and job both scale with the blocks, so the share holds for the whole
model's depth. Nothing is asserted; the numbers are for `bench/results/cpu/lora_switch.txt`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

_TARGETS = {"self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
            "self_attn.o": "attn1.to_out.0", "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k",
            "cross_attn.v": "attn2.to_v", "cross_attn.o": "attn2.to_out.0", "ffn.0": "ffn.net.0.proj",
            "ffn.2": "ffn.net.2"}
"""Original Wan module names -> diffusers': every Linear of a block the LightX2V LoRAs adapt."""


def _stack(layers: int, heads: int):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    ).eval()


def _adapter(model, path: str, rank: int, seed: int) -> str:
    """A random adapter of `model` in the original Wan layout, written to `path`."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    state = {}
    for block in range(len(model.blocks)):
        for original, ours in _TARGETS.items():
            out, width = model.get_submodule(f"blocks.{block}.{ours}").weight.shape
            head = f"diffusion_model.blocks.{block}.{original}"
            state[f"{head}.lora_down.weight"] = torch.randn(rank, width, generator=generator) * 0.01
            state[f"{head}.lora_up.weight"] = torch.randn(out, rank, generator=generator) * 0.01
            state[f"{head}.alpha"] = torch.tensor(float(rank))
    save_file(state, path)
    return path


def _job_seconds(model, steps: int, branches: int, frames: int, size: int) -> float:
    import torch
    from diffusers import UniPCMultistepScheduler

    gen = torch.Generator().manual_seed(1)
    # (b, c, f, h, w) noise; (b, text tokens, 4096) UMT5 embeddings, one per branch
    latents = torch.randn(1, 16, (frames - 1) // 4 + 1, size // 8, size // 8, generator=gen)
    context = [torch.randn(1, 64, 4096, generator=gen) for _ in range(branches)]
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(steps)
    started = time.perf_counter()
    with torch.no_grad():
        for t in scheduler.timesteps:
            predictions = [model(hidden_states=latents, timestep=t.expand(1), encoder_hidden_states=text,
                                 return_dict=False)[0] for text in context]
            noise = predictions[0] if branches == 1 else predictions[1] + 5.0 * (predictions[0] - predictions[1])
            latents = scheduler.step(noise, t, latents, return_dict=False)[0]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--rank", type=int, default=64, help="the adapters' rank (LightX2V ships 32, 64 and 128)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    from genbatch.jobs.lora import LoraRef
    from genbatch.jobs.spec import JobSpec
    from genbatch.models import resolve_model
    from genbatch.runner.adapters import Adapters

    torch.set_num_threads(opts.threads)
    model = _stack(opts.layers, opts.heads)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=model,
                       scheduler=FlowMatchEulerDiscreteScheduler())
    spec = resolve_model("tiny-wan")
    adapters = Adapters()
    with tempfile.TemporaryDirectory() as folder:
        paths = [_adapter(model, os.path.join(folder, f"{name}.safetensors"), opts.rank, seed)
                 for seed, name in enumerate("ab")]
        sizes = [os.path.getsize(path) / 2**20 for path in paths]

        def plan(*refs):
            job = JobSpec(id="j", prompt="p", negative_prompt=None, model="tiny-wan", width=opts.size,
                          height=opts.size, num_frames=opts.frames, num_inference_steps=opts.steps,
                          guidance_scale=5.0, seed=0, fps=16, row=0, lora=tuple(refs))
            return adapters.plan(job, spec, pipe)

        prepare = []
        for path in paths:
            started = time.perf_counter()
            plan(LoraRef(path))
            prepare.append(time.perf_counter() - started)
        switches: dict[str, list[float]] = {"first (base to A)": [], "A to B": [], "B to none": [], "none to A": []}
        sets = {"A": plan(LoraRef(paths[0])), "B": plan(LoraRef(paths[1])), "none": plan()}
        for round_ in range(opts.rounds):
            for name, target in (("first (base to A)", "A"), ("A to B", "B"), ("B to none", "none"),
                                 ("none to A", "A")):
                if name.startswith("first") and round_:
                    continue  # only the first switch of a pipeline keeps its base weights
                started = time.perf_counter()
                sets[target].apply()
                switches[name].append(time.perf_counter() - started)
            sets["none"].apply()
    full = min(_job_seconds(model, opts.steps, 2, opts.frames, opts.size) for _ in range(opts.rounds))
    few = min(_job_seconds(model, 4, 1, opts.frames, opts.size) for _ in range(opts.rounds))
    weights = sum(p.numel() for p in model.parameters()) / 1e6
    adapted = sum(model.get_submodule(f"blocks.{b}.{m}").weight.numel()
                  for b in range(opts.layers) for m in _TARGETS.values()) / 1e6
    print(f"Wan block stack: {opts.layers} blocks, {opts.heads} heads x 128, FFN 8960 ({weights:.0f}M parameters, "
          f"{adapted:.0f}M of them adapted), random weights; adapters of rank {opts.rank} "
          f"({sizes[0]:.1f} MiB each, original Wan layout); {opts.threads} threads, the fastest of {opts.rounds}")
    print(f"\n{'what':<34}{'seconds':>9}{f'of a {opts.steps}-step CFG job':>22}{'of a 4-step job':>17}")
    rows = [("prepare an adapter (read, convert)", min(prepare))]
    rows += [(f"switch: {name}", min(times)) for name, times in switches.items()]
    rows += [(f"job: {opts.steps} steps x 2 forwards", full), ("job: 4 steps x 1 forward", few)]
    for name, seconds in rows:
        print(f"{name:<34}{seconds:>9.3f}{seconds / full:>21.1%}{seconds / few:>17.1%}")
    tokens = ((opts.frames - 1) // 4 + 1) * (opts.size // 16) ** 2
    print(f"\nprepare: once per adapter and run (the group leader reads and converts it). switch: base + the new "
          "set's deltas written over the adapted weights in place, on every rank, when a job's adapter set "
          f"differs from the last job's; the first also copies those weights' base to the host. A switch's work "
          f"is its deltas' GEMMs, 2 x rank x adapted parameters ({2 * opts.rank * adapted / 1e3:.0f} GFLOP here), "
          f"whatever the job's size; a job's grows with its tokens ({tokens} here; Wan at 480p, 81 frames: 32760). "
          "The shares here are an upper bound for real sizes.")


if __name__ == "__main__":
    main()
