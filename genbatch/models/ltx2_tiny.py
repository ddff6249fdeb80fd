"""The tiny LTX-2 preset (`tiny-ltx2`, and `tiny-ltx2-i2v` from the same components): the real diffusers and
transformers classes of `LTX2Pipeline` with small configs and seeded random weights (`genbatch.models.ltx2`)."""

from __future__ import annotations

TINY_TRANSFORMER = dict(in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=8,
                        cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8,
                        audio_num_attention_heads=4, audio_attention_head_dim=4, audio_cross_attention_dim=16,
                        num_layers=2, caption_channels=32)
"""Video 4 heads x 8, audio 4 heads x 4 (Ulysses and tp of 2 and 4 divide both), two blocks; the published
layout otherwise (interleaved rotary tables, no perturbed attention, LTX-2.0's text projections)."""
TINY_VAE = dict(latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 16, 32),
                layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                spatio_temporal_scaling=(True, True, True, True), decoder_spatio_temporal_scaling=(True, True, True),
                decoder_inject_noise=(False, False, False, False), upsample_residual=(True, True, True),
                upsample_factor=(2, 2, 2), decoder_causal=False, spatial_compression_ratio=32,
                temporal_compression_ratio=8)
"""LTX-2's video VAE layout (patch 4, three 2x spatio-temporal upsamplers: 32x spatial, 8x temporal) with 8-32
channels and one resnet a stage."""
TINY_AUDIO_VAE = dict(base_channels=8, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=1, latent_channels=2,
                      mel_bins=16, resolution=32)
"""Stereo mel, 16 bins; two downsamplings (4x in time and mel, the published ratios): 2 channels x 4 latent mel
bins, the transformer's 8 audio channels (its latent statistics span `base_channels` = 8 values)."""
TINY_VOCODER = dict(in_channels=2 * 16, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[8, 8, 20],
                    upsample_factors=[4, 4, 10], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3]],
                    output_sampling_rate=16000)
"""Stereo at 16 kHz: the mel's 100 frames a second upsampled 160x."""
TINY_TEXT = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                 sliding_window=16, max_position_embeddings=2048)
"""A two-layer Gemma 3 text model; the pipeline stacks its three hidden states (embeddings and two layers)."""
TINY_VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                   patch_size=14)
TINY_SCHEDULER = dict(base_image_seq_len=1024, base_shift=0.95, max_image_seq_len=4096, max_shift=2.05,
                      shift_terminal=0.1, use_dynamic_shifting=True, time_shift_type="exponential")
"""Flow-match Euler with LTX-2's shift, its token count mapped to mu as the pipeline maps it."""
TINY_DEFAULTS = {"width": 96, "height": 64, "num_frames": 9, "num_inference_steps": 4, "guidance_scale": 3.0,
                 "fps": 24}
SOUND_GAIN = 40.0
"""The gain of the tiny vocoder's output projection, whose taps are shaped into a band-pass (deterministically,
after the seeded draw: `build_tiny`), so that its waveform is a sound, loud enough for the AAC round trip to be
measured."""


def build_tiny(meta: frozenset[str] = frozenset()):
    """LTX-2 (video and sound): LTX2VideoTransformer3DModel, a two-layer Gemma 3 with its connectors,
    AutoencoderKLLTX2Video, AutoencoderKLLTX2Audio and LTX2Vocoder, flow-match Euler."""
    from diffusers import LTX2Pipeline

    return LTX2Pipeline(**tiny_components(meta))


def tiny_components(meta: frozenset[str] = frozenset()) -> dict:
    """The tiny LTX-2 pipeline's components by name (`build_tiny`; image-to-video's too)."""
    import torch
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from genbatch.models.tiny import character_tokenizer, seeded

    tokenizer = character_tokenizer(model_max_length=1024)  # the pipeline pads prompts to 1024
    vocab = len(tokenizer)
    config = Gemma3Config(text_config={**TINY_TEXT, "vocab_size": vocab}, vision_config=TINY_VISION,
                          mm_tokens_per_image=4, image_token_index=vocab + 1, boi_token_index=vocab + 2,
                          eoi_token_index=vocab + 3)
    text_encoder = seeded(0, lambda: Gemma3ForConditionalGeneration(config), "text_encoder", meta)
    layers = TINY_TEXT["num_hidden_layers"] + 1
    connectors = seeded(1, lambda: LTX2TextConnectors(
        caption_channels=TINY_TEXT["hidden_size"], text_proj_in_factor=layers, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32))
    transformer = seeded(2, lambda: LTX2VideoTransformer3DModel(**TINY_TRANSFORMER), "transformer", meta)
    vae = seeded(3, lambda: AutoencoderKLLTX2Video(**TINY_VAE))
    audio_vae = seeded(4, lambda: AutoencoderKLLTX2Audio(**TINY_AUDIO_VAE))
    vocoder = seeded(5, lambda: LTX2Vocoder(**TINY_VOCODER))
    with torch.no_grad():
        # each input's taps a smooth band-pass (a Hann window less its mean: no DC, little above 4 kHz) at a random
        # gain, no bias: a sound rather than the white noise (and DC) the random layers make
        weight = vocoder.conv_out.weight
        taps = torch.hann_window(weight.shape[2] + 2, periodic=False)[1:-1]
        weight.copy_(weight.mean(dim=2, keepdim=True).sign() * weight.abs().mean(dim=2, keepdim=True)
                     * (taps - taps.mean()) * SOUND_GAIN)
        vocoder.conv_out.bias.zero_()
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**TINY_SCHEDULER), vae=vae, audio_vae=audio_vae,
                text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors, transformer=transformer,
                vocoder=vocoder)


__all__ = ["TINY_DEFAULTS", "TINY_TRANSFORMER", "TINY_VAE", "build_tiny", "tiny_components"]
