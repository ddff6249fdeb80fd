"""Patch-parallel VAE rules as data: decoder (and encoder) module class (qualified `module:Class`) -> rule kind.

A family names its VAE classes and the rule kind of every module class met in their decoders, and in the
encoders of those it encodes tile-parallel too (`ModelFamily.vae_classes`, `ModelFamily.vae_rules`);
`genbatch.parallel.vae.forwards` implements each kind.
A class no family lists makes the VAE unsupported (it decodes on one rank), so a new upstream layer can
never silently give a wrong image.
"""

from __future__ import annotations

LOCAL = "local"
"""Per-pixel or per-channel work, or a container: runs on a tile unchanged."""
RESNET = "resnet"
"""A ResnetBlock2D: local if it has no up/down sampling or time embedding of its own."""
UPSAMPLE = "upsample"
"""An Upsample2D: local if it interpolates (not a transposed convolution)."""
WAN_RESAMPLE = "wan_resample"
"""A WanResample: local in its upsampling modes."""
CONV2D = "conv2d"
"""A zero-padded 'same' 2-D convolution: gets halos from the neighbouring tiles (or, unpadded with stride 2,
runs on the tile its halo pad extended)."""
DOWNSAMPLE = "downsample"
"""A Downsample2D convolving with stride 2 after its own (0, 1, 0, 1) pad: the pad's row and column come from the
neighbouring tiles."""
HALO_PAD = "halo_pad"
"""ZeroPad2d((0, 1, 0, 1)) before a stride-2 convolution (Wan's downsampling): the row below and the column to
the right come from the neighbouring tiles, zeros only at the image's border."""
CAUSAL_CONV3D = "causal_conv3d"
"""Wan's causal 3-D convolution: halos in height and width, its own causal padding in time."""
CAUSAL_CONV2D = "causal_conv2d"
"""Qwen-Image 2.1's image form of Wan's causal convolution (a Conv2d on the one frame, zero-padded by its own
`_padding`, no feature cache): halos in height and width."""
GROUP_NORM = "group_norm"
"""GroupNorm: statistics over the whole image, gathered from the tiles."""
WAN_ATTENTION = "wan_attention"
"""Wan's mid-block attention: keys and values gathered from every tile."""
IMAGE_ATTENTION = "image_attention"
"""diffusers' mid-block self-attention over pixels: keys and values gathered from every tile."""
REPLICATE_CAUSAL_CONV3D = "replicate_causal_conv3d"
"""HunyuanVideo 1.5's causal 3-D convolution, which pads by replication: halos in height and width from the
neighbouring tiles, copies of the edge only at the image's true border, and its own causal replication in time."""
POINTWISE_CONV = "pointwise_conv"
"""A convolution with a kernel of 1 and stride 1 (a residual's channel projection): per pixel."""
FRAME_CAUSAL_ATTENTION = "frame_causal_attention"
"""HunyuanVideo 1.5's mid-block attention over every frame's pixels, each frame attending to itself and the frames
before it: keys and values gathered from every tile."""

LTX2_CONV3D = "ltx2_conv3d"
"""LTX-2's causal 3-D convolution: halos in height and width, the image's border padded as the layer pads it (zeros,
or the decoder's reflection), its own repeated first (and last) frames in time."""
LTX2_RESNET = "ltx2_resnet"
"""LTX-2's video resnet block: local unless it injects noise (drawn at the whole frame's size)."""

KINDS = (LOCAL, RESNET, UPSAMPLE, DOWNSAMPLE, WAN_RESAMPLE, CONV2D, HALO_PAD, CAUSAL_CONV3D, CAUSAL_CONV2D, GROUP_NORM,
         WAN_ATTENTION, IMAGE_ATTENTION, LTX2_CONV3D, LTX2_RESNET, REPLICATE_CAUSAL_CONV3D, POINTWISE_CONV,
         FRAME_CAUSAL_ATTENTION)

TORCH_LAYERS: dict[str, str] = {
    **{f"torch.nn:{name}": LOCAL for name in ("Sequential", "ModuleList", "Identity", "Dropout", "SiLU", "GELU",
                                               "ReLU", "Mish")},
    "torch.nn:Conv2d": CONV2D,
    "torch.nn:GroupNorm": GROUP_NORM,
}
"""The torch layers the decoders below are built from."""

AUTOENCODER_KL: dict[str, str] = {
    **TORCH_LAYERS,
    "diffusers.models.autoencoders.vae:Decoder": LOCAL,
    "diffusers.models.unets.unet_2d_blocks:UNetMidBlock2D": LOCAL,
    "diffusers.models.unets.unet_2d_blocks:UpDecoderBlock2D": LOCAL,
    "diffusers.models.resnet:ResnetBlock2D": RESNET,
    "diffusers.models.upsampling:Upsample2D": UPSAMPLE,
    "diffusers.models.attention_processor:Attention": IMAGE_ATTENTION,
    # the encoder's
    "diffusers.models.autoencoders.vae:Encoder": LOCAL,
    "diffusers.models.unets.unet_2d_blocks:DownEncoderBlock2D": LOCAL,
    "diffusers.models.downsampling:Downsample2D": DOWNSAMPLE,
}
"""The decoder and encoder of diffusers' `AutoencoderKL` (FLUX, SD3)."""

_WAN = "diffusers.models.autoencoders.autoencoder_kl_wan"
AUTOENCODER_KL_WAN: dict[str, str] = {
    **TORCH_LAYERS,
    **{f"{_WAN}:{name}": LOCAL for name in ("WanDecoder3d", "WanMidBlock", "WanUpBlock", "WanResidualUpBlock",
                                            "WanResidualBlock", "DupUp3D")},
    f"{_WAN}:WanUpsample": LOCAL,  # nearest-exact x2: output row i reads input row i // 2
    f"{_WAN}:WanRMS_norm": LOCAL,  # normalises over channels, per pixel
    f"{_WAN}:WanResample": WAN_RESAMPLE,
    f"{_WAN}:WanCausalConv3d": CAUSAL_CONV3D,
    f"{_WAN}:WanAttentionBlock": WAN_ATTENTION,
    # the encoder's
    **{f"{_WAN}:{name}": LOCAL for name in ("WanEncoder3d", "WanResidualDownBlock")},
    f"{_WAN}:AvgDown3D": LOCAL,  # means over 2x2 (x2 in time) blocks: local on tiles whose edges are even
    "torch.nn:ZeroPad2d": HALO_PAD,
}
"""The decoder and encoder of diffusers' `AutoencoderKLWan` (Wan 2.1 / 2.2)."""

_QWEN = "diffusers.models.autoencoders.autoencoder_kl_qwenimage"
AUTOENCODER_KL_QWEN_IMAGE: dict[str, str] = {
    **TORCH_LAYERS,
    **{f"{_QWEN}:{name}": LOCAL for name in ("QwenImageDecoder3d", "QwenImageMidBlock", "QwenImageUpBlock",
                                             "QwenImageResidualBlock", "QwenImageEncoder3d")},
    f"{_QWEN}:QwenImageUpsample": LOCAL,  # nearest-exact x2, as Wan's
    f"{_QWEN}:QwenImageRMS_norm": LOCAL,
    f"{_QWEN}:QwenImageResample": WAN_RESAMPLE,
    f"{_QWEN}:QwenImageCausalConv3d": CAUSAL_CONV3D,
    f"{_QWEN}:QwenImageAttentionBlock": WAN_ATTENTION,
    "torch.nn:ZeroPad2d": HALO_PAD,
}
"""The decoder and encoder of diffusers' `AutoencoderKLQwenImage` (Qwen-Image, Qwen-Image-Edit): Wan 2.1's VAE
under its own class names (the same layers, forwards and caches), so the same rules."""

_QWEN21 = "diffusers.models.autoencoders.autoencoder_kl_qwenimage21"
AUTOENCODER_KL_QWEN_IMAGE_21: dict[str, str] = {
    **TORCH_LAYERS,
    **{f"{_QWEN21}:{name}": LOCAL for name in ("QwenImage21Decoder3d", "QwenImage21MidBlock", "QwenImage21UpBlock",
                                               "QwenImage21ResidualUpBlock", "QwenImage21ResidualBlock",
                                               "QwenImage21Encoder3d", "QwenImage21ResidualDownBlock")},
    f"{_QWEN21}:QwenImage21Upsample": LOCAL,  # nearest-exact x2, as Wan's
    f"{_QWEN21}:QwenImage21RMS_norm": LOCAL,  # normalises over channels, per pixel
    f"{_QWEN21}:QwenImage21DupUp3D": LOCAL,  # each pixel to a 2x2 block (the first frame of two kept): local
    f"{_QWEN21}:QwenImage21AvgDown3D": LOCAL,  # means over 2x2 blocks: local on tiles whose edges are even
    f"{_QWEN21}:QwenImage21Resample": WAN_RESAMPLE,
    f"{_QWEN21}:QwenImage21CausalConv3d": CAUSAL_CONV2D,
    f"{_QWEN21}:QwenImage21AttentionBlock": WAN_ATTENTION,  # Wan's attention block, copied
    "torch.nn:ZeroPad2d": HALO_PAD,
}
"""The decoder and encoder of diffusers' `AutoencoderKLQwenImage21` (Qwen-Image 2.1): Wan 2.2's residual VAE made
for one image (its causal convolutions 2-D, no feature cache), RGBA in and out."""
_LTX2 = "diffusers.models.autoencoders.autoencoder_kl_ltx2"
AUTOENCODER_KL_LTX2_VIDEO: dict[str, str] = {
    **TORCH_LAYERS,
    **{f"{_LTX2}:{name}": LOCAL for name in ("LTX2VideoDecoder3d", "LTX2VideoMidBlock3d", "LTX2VideoUpBlock3d")},
    f"{_LTX2}:LTX2VideoUpsampler3d": LOCAL,  # its convolution, then channels to 2x2x2 pixels (and the shortcut)
    f"{_LTX2}:PerChannelRMSNorm": LOCAL,  # normalises over channels, per pixel
    f"{_LTX2}:LTX2VideoResnetBlock3d": LTX2_RESNET,
    f"{_LTX2}:LTX2VideoCausalConv3d": LTX2_CONV3D,
    "torch.nn:LayerNorm": LOCAL,  # a resnet's channel norm before its shortcut
    "torch.nn:Conv3d": POINTWISE_CONV,  # a resnet's channel shortcut (1x1x1)
}
"""The decoder of diffusers' `AutoencoderKLLTX2Video` (LTX-2): its last step turns each latent pixel's channels into
its 4x4 patch of pixels, local too."""
_HUNYUAN15 = "diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15"
AUTOENCODER_KL_HUNYUAN_VIDEO15: dict[str, str] = {
    **TORCH_LAYERS,
    **{f"{_HUNYUAN15}:{name}": LOCAL for name in ("HunyuanVideo15Decoder3D", "HunyuanVideo15Encoder3D",
                                                  "HunyuanVideo15MidBlock", "HunyuanVideo15UpBlock3D",
                                                  "HunyuanVideo15DownBlock3D", "HunyuanVideo15ResnetBlock")},
    f"{_HUNYUAN15}:HunyuanVideo15RMS_norm": LOCAL,  # normalises over channels, per pixel
    # a convolution, then depth-to-space (x2 in height and width): output row i reads input row i // 2
    f"{_HUNYUAN15}:HunyuanVideo15Upsample": LOCAL,
    # a convolution, then space-to-depth over 2x2 blocks: local on tiles whose edges are even (an encode's are)
    f"{_HUNYUAN15}:HunyuanVideo15Downsample": LOCAL,
    f"{_HUNYUAN15}:HunyuanVideo15CausalConv3d": REPLICATE_CAUSAL_CONV3D,
    f"{_HUNYUAN15}:HunyuanVideo15AttnBlock": FRAME_CAUSAL_ATTENTION,
    "torch.nn:Conv3d": POINTWISE_CONV,  # a resnet's shortcut projection
}
"""The decoder and encoder of diffusers' `AutoencoderKLHunyuanVideo15` (HunyuanVideo 1.5): every frame at once (no
temporal chunks or caches), convolutions padded by replication."""
