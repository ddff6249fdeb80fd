"""The benchmark models: Wan 2.1 architectures with deterministic random weights, saved once to a cache
directory and run from there with `--model DIR` (the loading path users take, and the one the plain
diffusers pipeline takes in `versus`).

    tiny-wan            the `tiny-wan` preset as it is (tests: milliseconds a step)
    tiny-qwen-image     the `tiny-qwen-image` preset as it is (Qwen-Image's dual-stream DiT, true CFG)
    tiny-hunyuan-video  the `tiny-hunyuan-video` preset as it is (HunyuanVideo, embedded guidance)
    bench-wan           tiny-wan with a 4-layer, 8 x 48-head, ~11M-parameter transformer (about a second a
                        step on a CPU at 33 frames, 256 px)
    wan-300m-random     tiny-wan with a transformer of Wan 2.1 1.3B's width (12 heads x 128, FFN 8960) and 6 of its
                        30 blocks, ~296M parameters, saved in bf16 (bench/quantization.py: what fp8 and int8
                        weights save on a CPU)
    wan2.1-1.3b-random  Wan 2.1 T2V 1.3B: the real transformer and VAE configs; a UMT5 text encoder of the
                        real width (4096) with 2 of its 24 layers (text encoding runs once a job and is timed
                        apart from the steps); weights saved in bf16
    tiny-flux           the `tiny-flux` preset as it is (FLUX.1 layout: dual- and single-stream blocks)
    bench-flux          tiny-flux with a 2 dual- + 4 single-stream, 8 x 64-head transformer (FLUX.1's layout at a
                        width a CPU runs in about a second a step at 256 px)
    flux.1-dev-random   FLUX.1-dev: the real transformer (12B: 19 dual- and 38 single-stream blocks, 24 heads x
                        128) and VAE configs; CLIP-L and T5-XXL at their real widths (768, 4096) with 2 layers
                        each; built on the GPU when there is one (12B parameters take minutes to initialise on
                        CPUs), weights saved in bf16
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from genbatch.models import hunyuan_video, qwen_image, tiny_configs
from genbatch.models.flux import FLUX1_DEV_TRANSFORMER, FLUX1_VAE
from genbatch.models.wan import WAN21_1_3B_TRANSFORMER

BENCH_WAN_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=8, attention_head_dim=48, in_channels=16, out_channels=16,
    text_dim=32, freq_dim=256, ffn_dim=1536, num_layers=4, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
)

BENCH_FLUX_TRANSFORMER = {**tiny_configs.TINY_FLUX_TRANSFORMER, "num_layers": 2, "num_single_layers": 4,
                          "attention_head_dim": 64, "num_attention_heads": 8, "axes_dims_rope": (8, 28, 28)}

# Wan 2.1 1.3B's width with 6 of its 30 blocks and tiny-wan's 32-wide text encoder: ~296M parameters
WAN_300M_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=32, freq_dim=256, ffn_dim=8960, num_layers=6, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
WAN21_1_3B_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024,
)

# umt5-xxl at its real width, 2 of its 24 layers.
WAN21_TEXT_ENCODER = dict(
    d_model=4096, d_kv=64, d_ff=10240, num_layers=2, num_heads=64, relative_attention_num_buckets=32,
    relative_attention_max_distance=128, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
    decoder_start_token_id=0,
)

FLUX1_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15, shift=3.0,
                       use_dynamic_shifting=True)
# clip-vit-large-patch14's text model and t5-v1_1-xxl at their real widths, 2 layers each.
FLUX1_CLIP = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=12,
                  max_position_embeddings=77, projection_dim=768, hidden_act="quick_gelu")
FLUX1_T5 = {**WAN21_TEXT_ENCODER}


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchModel:
    """A model a suite runs, built from configs with fixed seeds."""

    name: str
    """What reports call it."""
    description: str
    """One line for reports: the architecture and its size."""
    build: Callable[[], object]
    """Builds the whole diffusers pipeline on the CPU (random weights, same every time)."""
    recipe: dict = field(default_factory=dict)
    """Everything `build` depends on; a change gives a new cache directory."""
    save_dtype: str = "fp32"
    """Dtype of the saved transformer and text encoder (`bf16` halves big models on disk)."""
    num_heads: int = 0
    """Attention heads of the transformer (the Ulysses degree must divide it)."""

    def cache_key(self) -> str:
        import diffusers

        text = json.dumps({"recipe": self.recipe, "dtype": self.save_dtype, "diffusers": diffusers.__version__},
                          sort_keys=True, default=str)
        return f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _preset(name: str) -> Callable[[], object]:
    def build():
        from genbatch.runner.presets import build_preset

        return build_preset(name)

    return build


_tiny_wan = _preset("tiny-wan")


def _bench_wan():
    import torch
    from diffusers import WanTransformer3DModel

    pipe = _tiny_wan()
    torch.manual_seed(11)
    pipe.transformer = WanTransformer3DModel(**BENCH_WAN_TRANSFORMER).eval()
    return pipe


def _bench_flux():
    import torch
    from diffusers import FluxTransformer2DModel

    pipe = _preset("tiny-flux")()
    torch.manual_seed(12)
    pipe.transformer = FluxTransformer2DModel(**BENCH_FLUX_TRANSFORMER).eval()
    return pipe


def _wan_300m():
    import torch
    from diffusers import WanTransformer3DModel

    pipe = _tiny_wan()
    torch.manual_seed(13)
    pipe.transformer = WanTransformer3DModel(**WAN_300M_TRANSFORMER).eval()
    return pipe


def _wan21_1_3b():
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from genbatch.models.tiny import character_tokenizer

    tokenizer = character_tokenizer(model_max_length=512)
    torch.manual_seed(0)
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **WAN21_TEXT_ENCODER)).eval()
    torch.manual_seed(1)
    transformer = WanTransformer3DModel(**WAN21_1_3B_TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = AutoencoderKLWan().eval()  # its defaults are the Wan 2.1 VAE
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer)


def _flux1_dev():
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from genbatch.models.tiny import character_tokenizer

    clip_tokenizer = character_tokenizer(model_max_length=77)
    t5_tokenizer = character_tokenizer(model_max_length=512)
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=1)
    torch.manual_seed(0)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(clip_tokenizer), **FLUX1_CLIP, **ids)).eval()
    torch.manual_seed(1)
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), **FLUX1_T5)).eval()
    torch.manual_seed(2)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # 12B parameters: minutes on CPUs
        transformer = FluxTransformer2DModel(**FLUX1_DEV_TRANSFORMER).eval()
    torch.manual_seed(3)
    vae = AutoencoderKL(**FLUX1_VAE).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX1_SCHEDULER)
    return FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=clip_tokenizer, text_encoder_2=t5,
                        tokenizer_2=t5_tokenizer, transformer=transformer)

_TINY_RECIPE = {"preset": "tiny-wan", "transformer": tiny_configs.TINY_WAN_TRANSFORMER,
                "vae": tiny_configs.TINY_WAN_VAE}
_QWEN_RECIPE = {"preset": "tiny-qwen-image", "transformer": qwen_image.TINY_TRANSFORMER, "vae": qwen_image.TINY_VAE}
_HUNYUAN_RECIPE = {"preset": "tiny-hunyuan-video", "transformer": hunyuan_video.TINY_TRANSFORMER,
                   "vae": hunyuan_video.TINY_VAE}

MODELS: dict[str, BenchModel] = {
    model.name: model
    for model in (
        BenchModel(name="tiny-wan", description="the tiny-wan preset: Wan 2.1 layout, 2 layers, 4 heads x 12",
                   build=_tiny_wan, recipe=_TINY_RECIPE, num_heads=4),
        BenchModel(name="tiny-qwen-image", build=_preset("tiny-qwen-image"), recipe=_QWEN_RECIPE, num_heads=4,
                   description="the tiny-qwen-image preset: Qwen-Image layout (dual-stream), 2 layers, 4 heads x 16"),
        BenchModel(name="tiny-hunyuan-video", build=_preset("tiny-hunyuan-video"), recipe=_HUNYUAN_RECIPE,
                   num_heads=4, description="the tiny-hunyuan-video preset: HunyuanVideo layout, 1 dual- and 1 "
                   "single-stream layer, 4 heads x 8"),
        BenchModel(name="tiny-flux", build=_preset("tiny-flux"), num_heads=4,
                   recipe={"preset": "tiny-flux", "transformer": tiny_configs.TINY_FLUX_TRANSFORMER,
                           "vae": tiny_configs.TINY_FLUX_VAE},
                   description="the tiny-flux preset: FLUX.1 layout, 1 dual- and 1 single-stream layer, 4 heads x 16"),
        BenchModel(name="flux.1-dev-random", build=_flux1_dev, save_dtype="bf16", num_heads=24,
                   description="FLUX.1-dev architecture (19 dual- + 38 single-stream layers, 24 heads x 128, 12B), "
                   "random weights; CLIP-L and T5-XXL at their widths with 2 layers each",
                   recipe={"transformer": FLUX1_DEV_TRANSFORMER, "vae": FLUX1_VAE, "clip": FLUX1_CLIP,
                           "t5": FLUX1_T5}),
        BenchModel(name="bench-flux", build=_bench_flux, num_heads=8,
                   recipe={"preset": "tiny-flux", "transformer": BENCH_FLUX_TRANSFORMER,
                           "vae": tiny_configs.TINY_FLUX_VAE},
                   description="FLUX.1 layout, 2 dual- + 4 single-stream layers, 8 heads x 64"),
        BenchModel(name="bench-wan", description="Wan 2.1 layout, 4 layers, 8 heads x 48, ffn 1536, ~11M parameters",
                   build=_bench_wan, recipe={**_TINY_RECIPE, "transformer": BENCH_WAN_TRANSFORMER},
                   num_heads=8),
        BenchModel(name="wan-300m-random", build=_wan_300m, save_dtype="bf16", num_heads=12,
                   description="Wan 2.1 layout at 1.3B's width (12 heads x 128, FFN 8960), 6 blocks, ~296M "
                   "parameters, random weights; tiny-wan's text encoder and VAE",
                   recipe={**_TINY_RECIPE, "transformer": WAN_300M_TRANSFORMER}),
        BenchModel(name="wan2.1-1.3b-random", build=_wan21_1_3b,
                   description="Wan 2.1 T2V 1.3B architecture (30 layers, 12 heads x 128), random weights; "
                   "UMT5 at width 4096 with 2 layers", save_dtype="bf16", num_heads=12,
                   recipe={"transformer": WAN21_1_3B_TRANSFORMER, "text_encoder": WAN21_TEXT_ENCODER,
                           "vae": "default"}),
    )
}


def default_cache_dir() -> str:
    """`$GENBATCH_CACHE/bench`, else `$XDG_CACHE_HOME/genbatch/bench`, else `~/.cache/genbatch/bench`."""
    if os.environ.get("GENBATCH_CACHE"):
        return os.path.join(os.environ["GENBATCH_CACHE"], "bench")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "genbatch", "bench")


def materialize(model: BenchModel, cache_dir: str | None = None) -> str:
    """The model's pipeline directory, built and saved on first use; later calls return it at once."""
    root = cache_dir or default_cache_dir()
    path = os.path.join(root, model.cache_key())
    if os.path.isfile(os.path.join(path, "model_index.json")):
        return path
    os.makedirs(root, exist_ok=True)
    temp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards" would interleave with our progress
    pipe = model.build()
    if model.save_dtype == "bf16":
        import torch

        for name in ("transformer", "text_encoder", "text_encoder_2"):
            # plain Module.to: only the stored copy is bf16; loading with dtype=... keeps the
            # model's fp32 modules (norms, time embedder) in fp32 again, as for any published checkpoint
            if getattr(pipe, name, None) is not None:
                torch.nn.Module.to(getattr(pipe, name), torch.bfloat16)
    pipe.save_pretrained(temp)
    del pipe
    _release_device_memory()  # a model built on the GPU: the sides that load it run in other processes
    try:
        os.replace(temp, path)  # whole or not at all; a concurrent builder may have won the race
    except OSError:
        shutil.rmtree(temp, ignore_errors=True)
        if not os.path.isfile(os.path.join(path, "model_index.json")):
            raise
    return path


def _release_device_memory() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
