"""LoRA files for tests: random adapters in the formats diffusers' loaders read, made with peft (the diffusers
layout) or written key by key (the original Wan `diffusion_model.*` layout), with B scaled up so that an
applied adapter moves a tiny model's output far more than rounding does."""

from __future__ import annotations

import os

import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline

UP_SCALE = 40.0
"""What lora_B is multiplied by (random peft adapters move a tiny FLUX by only a few levels otherwise)."""


def peft_lora(preset: str, directory, targets: tuple[str, ...], *, rank: int = 4, alpha: float = 8.0,
              seed: int = 0) -> str:
    """A random LoRA of `preset`'s transformer on the modules named `targets`, saved by the pipeline's own
    `save_lora_weights` (with its peft metadata: alpha / rank) into `directory`; the directory."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32)
    torch.manual_seed(seed)
    pipe.transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=False,
                                            target_modules=list(targets)))
    state = {key: value * UP_SCALE if "lora_B" in key else value
             for key, value in get_peft_model_state_dict(pipe.transformer).items()}
    type(pipe).save_lora_weights(str(directory), transformer_lora_layers=state,
                                 transformer_lora_adapter_metadata={"r": rank, "lora_alpha": alpha,
                                                                    "target_modules": list(targets)})
    return str(directory)


_WAN_ORIGINAL = {"self_attn.q": "attn1.to_q", "self_attn.v": "attn1.to_v", "cross_attn.k": "attn2.to_k",
                 "ffn.0": "ffn.net.0.proj"}
"""Original Wan module names -> diffusers' (what the LoRA below targets)."""


def wan_original_lora(path, preset: str = "tiny-wan", *, rank: int = 4, alpha: float = 2.0, seed: int = 0) -> str:
    """A random LoRA of `preset`'s Wan transformer in the original layout the LightX2V and ComfyUI LoRAs use
    (`diffusion_model.blocks.N.self_attn.q.lora_down.weight`, `.alpha`), which diffusers' Wan loader converts;
    written to the file `path`."""
    from safetensors.torch import save_file

    transformer = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32).transformer
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for block in range(len(transformer.blocks)):
        for original, ours in _WAN_ORIGINAL.items():
            out, width = transformer.get_submodule(f"blocks.{block}.{ours}").weight.shape
            head = f"diffusion_model.blocks.{block}.{original}"
            state[f"{head}.lora_down.weight"] = torch.randn(rank, width, generator=generator) * 0.3
            state[f"{head}.lora_up.weight"] = torch.randn(out, rank, generator=generator) * 0.3 * UP_SCALE / 10
            state[f"{head}.alpha"] = torch.tensor(alpha)
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    save_file(state, str(path))
    return str(path)
