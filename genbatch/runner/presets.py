"""Built-in tiny models: the real diffusers classes, small configs, deterministic random weights.

They make the main job runnable anywhere (no model hub, no GPU) and give the tests real architectures to
load, parallelise and compare. Each preset is a function that builds a whole diffusers pipeline; the same
seed always gives the same weights, so two processes that build a preset hold identical models.
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Callable, Collection

import torch

from genbatch.models import tiny_configs as configs

PRESETS: dict[str, Callable[..., object]] = {}


def _preset(name: str):
    def register(builder: Callable[..., object]) -> Callable[..., object]:
        PRESETS[name] = builder
        return builder

    return register


def build_preset(name: str, meta: Collection[str] = ()):
    """Build the named preset pipeline on the CPU in fp32.

    Components named in `meta` (e.g. "transformer") are built on the meta device: their shapes without
    their weights, for ranks that will receive only a shard of them.
    """
    try:
        builder = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)} or pass a pipeline directory") from None
    return builder(frozenset(meta))


def _placed(component: str, meta: frozenset[str]):
    return torch.device("meta") if component in meta else contextlib.nullcontext()


def character_tokenizer(model_max_length: int):
    """A tokenizer with one token per character, built in memory (no files, no downloads).

    Every distinct prompt gives distinct ids, and it saves and reloads like any fast tokenizer.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    alphabet = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation + " ")
    vocab = {token: index for index, token in enumerate(specials + alphabet)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
    )


def _t5_config(vocab_size: int):
    return dict(
        vocab_size=vocab_size,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def _clip_config(vocab_size: int):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )


@_preset("tiny-wan")
def tiny_wan(meta: frozenset[str] = frozenset()):
    """Wan 2.1 text-to-video (a CFG model): WanTransformer3DModel, AutoencoderKLWan, UMT5, UniPC flow scheduler."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = character_tokenizer(model_max_length=512)
    torch.manual_seed(0)
    with _placed("text_encoder", meta):
        text_encoder = UMT5EncoderModel(UMT5Config(**_t5_config(len(tokenizer)))).eval()
    torch.manual_seed(1)
    with _placed("transformer", meta):
        transformer = WanTransformer3DModel(**configs.TINY_WAN_TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = AutoencoderKLWan(**configs.TINY_WAN_VAE).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler, transformer=transformer)


@_preset("tiny-flux")
def tiny_flux(meta: frozenset[str] = frozenset()):
    """FLUX.1 text-to-image, guidance-distilled: FluxTransformer2DModel, AutoencoderKL, CLIP + T5, flow Euler."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    clip_tokenizer = character_tokenizer(model_max_length=77)
    t5_tokenizer = character_tokenizer(model_max_length=512)
    torch.manual_seed(0)
    with _placed("text_encoder", meta):
        clip = CLIPTextModel(_clip_config(len(clip_tokenizer))).eval()
    torch.manual_seed(1)
    with _placed("text_encoder_2", meta):
        t5 = T5EncoderModel(T5Config(**_t5_config(len(t5_tokenizer)))).eval()
    torch.manual_seed(2)
    with _placed("transformer", meta):
        transformer = FluxTransformer2DModel(**configs.TINY_FLUX_TRANSFORMER).eval()
    torch.manual_seed(3)
    vae = AutoencoderKL(**configs.TINY_FLUX_VAE).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=4096,
        max_shift=1.15,
        use_dynamic_shifting=True,
        shift=3.0,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=clip_tokenizer,
        text_encoder_2=t5,
        tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )


@_preset("tiny-sd3")
def tiny_sd3(meta: frozenset[str] = frozenset()):
    """Stable Diffusion 3 (a CFG model): SD3Transformer2DModel (joint attention), two CLIPs + T5, flow Euler."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5Config, T5EncoderModel

    tokenizers = [character_tokenizer(model_max_length=77) for _ in range(2)]
    t5_tokenizer = character_tokenizer(model_max_length=256)
    encoders = []
    for index, (name, tokenizer) in enumerate(zip(("text_encoder", "text_encoder_2"), tokenizers)):
        torch.manual_seed(10 + index)
        with _placed(name, meta):
            encoders.append(CLIPTextModelWithProjection(_clip_config(len(tokenizer))).eval())
    torch.manual_seed(12)
    with _placed("text_encoder_3", meta):
        t5 = T5EncoderModel(T5Config(**_t5_config(len(t5_tokenizer)))).eval()
    torch.manual_seed(13)
    with _placed("transformer", meta):
        transformer = SD3Transformer2DModel(**configs.TINY_SD3_TRANSFORMER).eval()
    torch.manual_seed(14)
    vae = AutoencoderKL(**configs.TINY_SD3_VAE).eval()
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=encoders[0],
        tokenizer=tokenizers[0],
        text_encoder_2=encoders[1],
        tokenizer_2=tokenizers[1],
        text_encoder_3=t5,
        tokenizer_3=t5_tokenizer,
        transformer=transformer,
    )
