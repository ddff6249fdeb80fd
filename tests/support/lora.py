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


def peft_lora(preset: str, directory, targets: tuple[str, ...], *, component: str = "transformer", rank: int = 4,
              alpha: float = 8.0, seed: int = 0) -> str:
    """A random LoRA of `preset`'s `component` (its transformer, or `text_encoder`) on the modules named `targets`,
    in the diffusers/peft layout (`<component>.<module>.lora_A.weight`), saved by the pipeline's own
    `save_lora_weights` (with its peft metadata: alpha / rank) into `directory`; the directory. (Injected with
    peft directly, as diffusers' `add_adapter` does: transformers' own asks for a newer peft than diffusers'.)"""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    pipe = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32)
    model = getattr(pipe, component)
    torch.manual_seed(seed)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=False,
                                       target_modules=list(targets)), model)
    state = {key: value * UP_SCALE if "lora_B" in key else value
             for key, value in get_peft_model_state_dict(model).items()}
    type(pipe).save_lora_weights(str(directory), **{
        f"{component}_lora_layers": state,
        f"{component}_lora_adapter_metadata": {"r": rank, "lora_alpha": alpha, "target_modules": list(targets)}})
    return str(directory)


_WAN_ORIGINAL = {"self_attn.q": "attn1.to_q", "self_attn.v": "attn1.to_v", "cross_attn.k": "attn2.to_k",
                 "ffn.0": "ffn.net.0.proj"}
"""Original Wan module names -> diffusers' (what the LoRA below targets)."""
_QWEN_COMFY = {name: name for name in ("attn.to_q", "attn.to_v", "attn.add_k_proj", "img_mlp.net.0.proj")}
"""Qwen-Image's ComfyUI/Lightning module names -> diffusers' (the same names, under `diffusion_model.`)."""


def _down_up_lora(path, preset: str, blocks: str, names: dict[str, str], head: str, *, rank: int, alpha: float,
                  seed: int) -> str:
    """A random LoRA of every block of `preset`'s transformer (`blocks`: its block list's attribute) on the modules
    `names` maps (the file's name -> diffusers'), as `lora_down` / `lora_up` / `alpha` keys under
    `head.N.<file's name>`; written to the file `path`."""
    from safetensors.torch import save_file

    transformer = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32).transformer
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for block in range(len(getattr(transformer, blocks))):
        for original, ours in names.items():
            out, width = transformer.get_submodule(f"{blocks}.{block}.{ours}").weight.shape
            key = f"{head}.{block}.{original}"
            state[f"{key}.lora_down.weight"] = torch.randn(rank, width, generator=generator) * 0.3
            state[f"{key}.lora_up.weight"] = torch.randn(out, rank, generator=generator) * 0.3 * UP_SCALE / 10
            state[f"{key}.alpha"] = torch.tensor(alpha)
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    save_file(state, str(path))
    return str(path)


def wan_original_lora(path, preset: str = "tiny-wan", *, rank: int = 4, alpha: float = 2.0, seed: int = 0) -> str:
    """A random LoRA of `preset`'s Wan transformer in the original layout the LightX2V and ComfyUI LoRAs use
    (`diffusion_model.blocks.N.self_attn.q.lora_down.weight`, `.alpha`), which diffusers' Wan loader converts;
    written to the file `path`."""
    return _down_up_lora(path, preset, "blocks", _WAN_ORIGINAL, "diffusion_model.blocks", rank=rank, alpha=alpha,
                         seed=seed)


def qwen_comfy_lora(path, preset: str = "tiny-qwen-image", *, rank: int = 4, alpha: float = 2.0, seed: int = 0) -> str:
    """A random LoRA of `preset`'s Qwen-Image transformer in the ComfyUI layout the Qwen-Image-Lightning LoRAs
    use (`diffusion_model.transformer_blocks.N.attn.to_q.lora_down.weight`, `.alpha`), which diffusers'
    Qwen-Image loader converts; written to the file `path`."""
    return _down_up_lora(path, preset, "transformer_blocks", _QWEN_COMFY, "diffusion_model.transformer_blocks",
                         rank=rank, alpha=alpha, seed=seed)


_KOHYA_FLUX_DOUBLE = {"img_attn_qkv": 3, "img_attn_proj": 1, "img_mlp_0": 1, "txt_attn_qkv": 3}
"""kohya's FLUX double-block layers the LoRA below adapts -> how many Linears each packs (q, k, v)."""
_KOHYA_CLIP = {f"self_attn_{name}": f"self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj", "out_proj")} | \
    {"mlp_fc1": "mlp.fc1", "mlp_fc2": "mlp.fc2"}
"""kohya's CLIP layer names -> the text encoder's module names."""


def kohya_flux_lora(path, preset: str = "tiny-flux", *, rank: int = 4, alpha: float = 2.0, seed: int = 0) -> str:
    """A random LoRA of `preset`'s FLUX transformer and CLIP text encoder in kohya's sd-scripts layout
    (`lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight`, `lora_unet_single_blocks_0_linear2...`,
    `lora_te1_text_model_encoder_layers_0_self_attn_q_proj...`, each with its `.alpha`), which diffusers'
    FLUX loader converts; written to the file `path`. (A single block's `linear1` is left out: diffusers
    splits it at FLUX.1's real widths.)"""
    from safetensors.torch import save_file

    pipe = load_pipeline(resolve_model(preset), torch.device("cpu"), torch.float32)
    transformer, clip = pipe.transformer, pipe.text_encoder
    width = transformer.transformer_blocks[0].attn.to_q.weight.shape[1]
    generator = torch.Generator().manual_seed(seed)
    state = {}

    def add(name: str, out: int, width: int) -> None:
        state[f"{name}.lora_down.weight"] = torch.randn(rank, width, generator=generator) * 0.3
        state[f"{name}.lora_up.weight"] = torch.randn(out, rank, generator=generator) * 0.3 * UP_SCALE / 10
        state[f"{name}.alpha"] = torch.tensor(alpha)

    for block in range(len(transformer.transformer_blocks)):
        ff = transformer.transformer_blocks[block].ff.net[0].proj.weight.shape[0]
        for layer, packed in _KOHYA_FLUX_DOUBLE.items():
            add(f"lora_unet_double_blocks_{block}_{layer}", ff if layer == "img_mlp_0" else width * packed, width)
    for block in range(len(transformer.single_transformer_blocks)):
        out, wide = transformer.single_transformer_blocks[block].proj_out.weight.shape
        add(f"lora_unet_single_blocks_{block}_linear2", out, wide)
    for layer in range(len(clip.encoder.layers)):
        for name, module in _KOHYA_CLIP.items():
            out, wide = clip.get_submodule(f"encoder.layers.{layer}.{module}").weight.shape
            add(f"lora_te1_text_model_encoder_layers_{layer}_{name}", out, wide)
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    save_file(state, str(path))
    return str(path)
