"""The configs of the built-in tiny presets, as plain data (no torch import), so specs can be read cheaply."""

TINY_WAN_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=12,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)

TINY_WAN_I2V_TRANSFORMER = dict(
    TINY_WAN_TRANSFORMER,
    in_channels=36,  # the noise (16), the first-frame mask (4) and the conditioning video's latents (16)
    image_dim=32,  # the CLIP vision encoder's width
    added_kv_proj_dim=48,  # the image context's keys and values, at the attention's width
)
TINY_WAN_FLF2V_TRANSFORMER = dict(
    TINY_WAN_I2V_TRANSFORMER,
    pos_embed_seq_len=2 * 17,  # two frames' CLIP tokens ((32 / 8)^2 patches + the class token, each)
)
TINY_WAN22_I2V_TRANSFORMER = dict(
    TINY_WAN_TRANSFORMER,
    in_channels=36,  # the noise (16), the first-frame mask (4) and the conditioning video's latents (16); no CLIP
)
TINY_WAN22_TI2V_TRANSFORMER = dict(TINY_WAN_TRANSFORMER, in_channels=16, out_channels=16)
"""Wan 2.2 TI2V: the image is the first latent frame (its input is its output's width), per-token timesteps."""
TINY_WAN22_VAE = dict(base_dim=8, decoder_base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                      is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
                      temperal_downsample=[False, True, True])
"""Wan 2.2's VAE (residual, 2x2 pixel patches: 16 pixels a latent pixel), TI2V's; narrow, 16 latent channels."""
TINY_CLIP_VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                        image_size=32, patch_size=8, projection_dim=32)

TINY_WAN_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True])

TINY_FLUX_TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=[4, 4, 8],
    guidance_embeds=True,
)

TINY_FLUX_VAE = dict(
    in_channels=3,
    out_channels=3,
    block_out_channels=[8, 8, 8, 8],
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    layers_per_block=1,
    latent_channels=16,
    norm_num_groups=4,
    use_quant_conv=False,
    use_post_quant_conv=False,
    shift_factor=0.1159,
    scaling_factor=0.3611,
    sample_size=64,
)

# Defaults the presets give jobs that leave a field empty: small enough to run in seconds on a CPU.
PRESET_DEFAULTS: dict[str, dict[str, float | int]] = {
    "tiny-wan": {"width": 64, "height": 48, "num_frames": 9, "num_inference_steps": 8, "guidance_scale": 5.0, "fps": 8},
    "tiny-wan-i2v": {"width": 64, "height": 48, "num_frames": 9, "num_inference_steps": 8, "guidance_scale": 5.0,
                     "fps": 8},
    "tiny-wan22-ti2v": {"width": 64, "height": 64, "num_frames": 9, "num_inference_steps": 8, "guidance_scale": 5.0,
                        "fps": 8},
    "tiny-flux": {"width": 64, "height": 64, "num_inference_steps": 6, "guidance_scale": 3.5},
    # auto_resize 0: an input image keeps its own size (Kontext's preferred resolutions are a megapixel)
    "tiny-flux-kontext": {"width": 64, "height": 64, "num_inference_steps": 6, "guidance_scale": 2.5,
                          "auto_resize": 0},
    "tiny-sd3": {"width": 64, "height": 64, "num_inference_steps": 6, "guidance_scale": 7.0},
}

TINY_SD3_TRANSFORMER = dict(
    sample_size=32,
    patch_size=2,
    in_channels=16,
    num_layers=2,
    attention_head_dim=8,
    num_attention_heads=4,
    caption_projection_dim=32,
    joint_attention_dim=32,
    pooled_projection_dim=64,
    out_channels=16,
)

TINY_SD3_VAE = {**TINY_FLUX_VAE, "shift_factor": 0.0609, "scaling_factor": 1.5305}
