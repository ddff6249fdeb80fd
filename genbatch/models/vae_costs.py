"""Each VAE's costs as the planner prices them: how its decoder and encoder hold memory and how much work a
pixel costs. A family names its VAE's costs in its record (`ModelFamily.vae_costs`); `genbatch.planner.vae_memory`
and `genbatch.planner.vae_encode` turn them into peak bytes per decode mode and encode.

Plain data, no torch. The constants were counted on diffusers' decoders and encoders at their published configs with
random weights (live tensors under a dispatch mode, FLOPs under torch's `FlopCounterMode`: `bench/vae_memory.py`,
whose outputs in bench/results/cpu/vae_memory*.txt compare the planner's model with the counts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True, slots=True)
class DecoderMemory:
    """How one VAE class's decoder holds memory while it decodes."""

    vae_class: str
    """The diffusers class name."""
    channels: int
    """Output-side channel width of the config the constants below were counted on (a decoder's activations
    scale with it)."""
    values_per_pixel: float
    """Live values per output pixel and per output frame of the chunk decoded at once, at the peak."""
    values_per_area: float
    """Live values per output pixel that do not grow with the chunk (feature caches of causal convolutions)."""
    frames_at_once: int | None
    """Output frames decoded at once without tiling; None: every frame (an image VAE: one)."""
    output_copies: float
    """Whole decoded outputs alive at the peak of a full decode (the result, and a concatenation's copy)."""
    tile: tuple[int, int] | None
    """(height, width) in output pixels of one tile with the VAE's own tiling; None: it cannot tile."""
    tiled_output_copies: float = 1.0
    """Whole outputs alive at a tiled decode's peak (the decoded tiles, their overlaps, the blended rows)."""
    full_work: float = 1.0
    """Decoder work of a full decode over one plain pass (overlapping temporal tiles decode frames twice)."""
    tiled_work: float = 1.0
    """Decoder work of a tiled decode over one plain pass: the tiles' overlaps are decoded twice."""
    mask_compression: tuple[int, int] | None = None
    """(spatial, temporal) compression of a decoder whose mid-block attention builds one mask over every pair of
    latent tokens it decodes at once (HunyuanVideo 1.5's: (frames x h x w)^2 values beside the activations, in full
    and tiled decodes; genbatch's patch-parallel attention builds none); None: no such mask."""

    def work(self, mode: str) -> float:
        """Decoder work in `mode` over one plain pass of the whole output."""
        return self.tiled_work if mode == "tiled" and self.tile is not None else self.full_work

    def scale(self, channels: int | None) -> float:
        """How much larger a decoder of `channels` output-side channels is than the one measured."""
        return 1.0 if not channels else channels / self.channels


IMAGE = DecoderMemory(vae_class="AutoencoderKL", channels=128, values_per_pixel=768.0, values_per_area=0.0,
                      frames_at_once=1, output_copies=1.0, tile=(1024, 1024), tiled_output_copies=3.0,
                      tiled_work=(1 / 0.75) ** 2)
"""FLUX / SD3 (block_out_channels 128, 256, 512, 512; sample_size 1024): 6 x 128 values a pixel at the last
stage (3 GiB in fp32 at 1024x1024); tiles overlap by a quarter."""
WAN = DecoderMemory(vae_class="AutoencoderKLWan", channels=96, values_per_pixel=1040.0, values_per_area=732.0,
                    frames_at_once=4, output_copies=1.0, tile=(256, 256), tiled_output_copies=3.2,
                    tiled_work=(256 / 192) ** 2)
"""Wan 2.1 (base_dim 96): one latent frame (four output frames) at a time, the feature cache beside it."""
QWEN_IMAGE = DecoderMemory(vae_class="AutoencoderKLQwenImage", channels=96, values_per_pixel=1040.0,
                           values_per_area=732.0, frames_at_once=4, output_copies=1.0, tile=(256, 256),
                           tiled_output_copies=3.2, tiled_work=(256 / 192) ** 2)
"""Qwen-Image: Wan's decoder, decoding one frame."""
QWEN_IMAGE_21 = DecoderMemory(vae_class="AutoencoderKLQwenImage21", channels=144, values_per_pixel=3067.0,
                              values_per_area=0.0, frames_at_once=1, output_copies=1.0, tile=(256, 256),
                              tiled_output_copies=3.2, tiled_work=(256 / 192) ** 2)
"""Qwen-Image 2.1 (decoder_base_dim 144, dim_mult 1-2-4-8-8, RGBA out): one frame, no feature cache; counted 3,070
values a pixel at 512^2 and 1024^2 (its 4 output channels included), and 208M values tiled at 1024^2 (256-pixel
tiles every 192), on the meta device (bench/vae_memory.py's count)."""
HUNYUAN_VIDEO = DecoderMemory(vae_class="AutoencoderKLHunyuanVideo", channels=128, values_per_pixel=1160.0,
                              values_per_area=0.0, frames_at_once=17, output_copies=1.2, tile=(256, 256),
                              tiled_output_copies=1.35, full_work=17 / 12, tiled_work=17 / 12 * (256 / 192) ** 2)
"""HunyuanVideo (block_out_channels 128, 256, 512, 512): framewise decode (17-frame temporal tiles every 12 frames)
is diffusers' default; tiling adds 256-pixel spatial tiles every 192 pixels."""
COGVIDEOX = DecoderMemory(vae_class="AutoencoderKLCogVideoX", channels=128, values_per_pixel=2545.0,
                          values_per_area=0.0, frames_at_once=9, output_copies=1.0, tile=(240, 360),
                          tiled_output_copies=1.0, tiled_work=(1 / (1 - 1 / 6)) * (1 / (1 - 1 / 5)))
"""CogVideoX and CogVideoX 1.5 (block_out_channels 128, 256, 256, 512; sample 480x720): the first batch of three
latent frames (nine output frames) is the largest; tiles overlap by 1/6 of their height and 1/5 of their width."""

LTX2_VIDEO = DecoderMemory(vae_class="AutoencoderKLLTX2Video", channels=256, values_per_pixel=48.0,
                           values_per_area=0.0, frames_at_once=None, output_copies=1.0, tile=(512, 512),
                           tiled_output_copies=1.5, tiled_work=(512 / 448) ** 2)
"""LTX-2 (block_out_channels 256-2048, decoder 1024, 512, 256 halved by its upsamplers, 4x4 pixel patches): every
frame at once (diffusers' default, no framewise decode); its last stage runs 128 channels at a quarter of the
height and width, 8 values an output pixel and frame a tensor, about six alive in a resnet (48). Estimated from
the layout, not counted by bench/vae_memory.py; tiles of 512 pixels every 448."""

FLUX2 = DecoderMemory(vae_class="AutoencoderKLFlux2", channels=128, values_per_pixel=768.0, values_per_area=0.0,
                      frames_at_once=1, output_copies=1.0, tile=(1024, 1024), tiled_output_copies=3.0,
                      tiled_work=(1 / 0.75) ** 2)
"""FLUX.2 (`AutoencoderKLFlux2`, the published `AutoencoderKLFlux2()` config): diffusers' Decoder at FLUX.1's widths
(128, 256, 512, 512; three resnets a stage), so the image VAE's figures; its latent has 32 channels, which only
the first convolution sees."""

HUNYUAN_VIDEO15 = DecoderMemory(vae_class="AutoencoderKLHunyuanVideo15", channels=128, values_per_pixel=768.0,
                                values_per_area=0.0, frames_at_once=None, output_copies=1.0, tile=(256, 256),
                                tiled_output_copies=1.3, tiled_work=(256 / 192) ** 2, mask_compression=(16, 4))
"""HunyuanVideo 1.5 (block_out_channels 128, 256, 512, 1024, 1024; 16x spatial): every frame at once, 6 x 128 values a
pixel and frame at the last stage (counted 768.0 on the meta device from 128x128 x 9 to 256x256 x 5), beside its
mid-block mask over every pair of latent tokens; tiled, 256-pixel tiles every 192 pixels over every frame (counted
785 and 812 values a tile pixel with about 1.0 and 1.2 outputs at 768x512 and 1024x768 x 5)."""

@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderMemory:
    """How one VAE class's encoder holds memory and spends work while it encodes."""

    vae_class: str
    """The diffusers class name."""
    channels: int
    """Input-side channel width of the config the constants were counted on (activations scale with it)."""
    values_per_pixel: float
    """Live values per input pixel and per input frame of the chunk encoded at once, at the peak."""
    values_per_area: float
    """Live values per input pixel that do not grow with the chunk (the causal convolutions' feature caches)."""
    frames_at_once: int | None
    """Input frames encoded at once after the first (1 for an image VAE); None: every frame at once."""
    input_copies: float
    """Whole inputs (3 values per pixel and frame) alive during the encode: the tensor the pipeline built."""
    mflop_per_pixel: float
    """Encoder work per input pixel and frame after the first, MFLOP."""
    first_frame_mflop_per_pixel: float
    """Encoder work per pixel of the first frame (or the one image), MFLOP: a causal encoder pads it with
    copies of itself, so it costs more than the frames after it."""

    def scale(self, channels: int | None) -> float:
        """How much larger an encoder of `channels` input-side channels is than the one measured."""
        return 1.0 if not channels else channels / self.channels


IMAGE_ENCODER = EncoderMemory(vae_class="AutoencoderKL", channels=128, values_per_pixel=640.0, values_per_area=0.0,
                              frames_at_once=1, input_copies=1.0, mflop_per_pixel=4.7,
                              first_frame_mflop_per_pixel=4.7)
"""FLUX / SD3 (block_out_channels 128, 256, 512, 512): 5 x 128 values a pixel at the first stage, counted 640.0 at
512^2 and at 1024^2 (2.5 GiB in fp32 at 1024^2); 4.66 MFLOP a pixel at 1024^2 (4.26 at 512^2: the mid-block
attention grows with the tokens)."""
WAN_ENCODER = EncoderMemory(vae_class="AutoencoderKLWan", channels=96, values_per_pixel=854.0, values_per_area=117.0,
                            frames_at_once=4, input_copies=1.0, mflop_per_pixel=5.05, first_frame_mflop_per_pixel=6.7)
"""Wan 2.1 (base_dim 96): 971 values a pixel for one frame, 3,533 from nine frames on (the first frame, then
chunks of four beside a full cache), the same at 208x120 and 1280x720; 6.67 MFLOP a pixel for one frame, 5.03 to
5.11 a pixel and frame over 81 (208x120 to 1280x720)."""
QWEN_IMAGE_ENCODER = replace(WAN_ENCODER, vae_class="AutoencoderKLQwenImage")
"""Qwen-Image: Wan's encoder, encoding one frame (counted 968 values and 6.76 MFLOP a pixel at 512^2)."""

QWEN_IMAGE_21_ENCODER = EncoderMemory(vae_class="AutoencoderKLQwenImage21", channels=96, values_per_pixel=965.0,
                                      values_per_area=0.0, frames_at_once=1, input_copies=1.0, mflop_per_pixel=3.0,
                                      first_frame_mflop_per_pixel=3.0)
"""Qwen-Image 2.1 (base_dim 96, dim_mult 1-2-4-8-8, RGBA in): its condition image in one pass, no feature cache;
counted 968 values (its 4 input channels included) and 2.98 to 3.01 MFLOP a pixel at 512^2 and 1024^2 on the meta
device."""
FLUX2_ENCODER = replace(IMAGE_ENCODER, vae_class="AutoencoderKLFlux2")
"""FLUX.2 (`AutoencoderKLFlux2`: diffusers' Encoder at FLUX.1's widths, 128, 256, 512, 512, two resnets a stage; only
its output convolution is wider, 64 channels for 32 latent ones): the image VAE's encoder."""

HUNYUAN_VIDEO15_ENCODER = EncoderMemory(vae_class="AutoencoderKLHunyuanVideo15", channels=128, values_per_pixel=768.0,
                                        values_per_area=137.0, frames_at_once=None, input_copies=1.0,
                                        mflop_per_pixel=14.0, first_frame_mflop_per_pixel=17.2)
"""HunyuanVideo 1.5 (block_out_channels 128, 256, 512, 1024, 1024): every frame at once, counted on the meta device
at 905 values a pixel for one frame (its I2V image, 128^2 to 256^2) and 768 a pixel and frame for nine; 17.2 MFLOP
a pixel for one frame, 14.4 a pixel and frame over nine. Its mid-block mask over one frame's latent tokens
(3,600 at 720p) is negligible beside the activations."""

@dataclass(frozen=True, kw_only=True, slots=True)
class VaeCosts:
    """One VAE's costs: its decoder's and encoder's memory, and its decode's work."""

    decoder: DecoderMemory
    """How its decoder holds memory (`vae_class`: the diffusers class it was counted on)."""
    encoder: EncoderMemory
    """How its encoder holds memory and spends work (an encoder not counted: priced as Wan's, or the image VAE's)."""
    mflop_per_pixel: float
    """Decode work per output pixel (and frame), MFLOP."""

    @property
    def vae_class(self) -> str:
        return self.decoder.vae_class


IMAGE_VAE = VaeCosts(decoder=IMAGE, encoder=IMAGE_ENCODER, mflop_per_pixel=9.9)
"""FLUX.1, SD3, Z-Image (`AutoencoderKL`, channels 512, 512, 256, 128; 3 resnets a stage): counting its 3x3
convolutions gives 10.4 TFLOP for a 1024x1024 image, 9.9 MFLOP per output pixel."""
FLUX2_VAE = VaeCosts(decoder=FLUX2, encoder=FLUX2_ENCODER, mflop_per_pixel=9.9)
"""FLUX.2 (`AutoencoderKLFlux2`): FLUX.1's decoder widths."""
WAN_VAE = VaeCosts(decoder=WAN, encoder=WAN_ENCODER, mflop_per_pixel=8.5)
"""Wan 2.1/2.2 (`AutoencoderKLWan`, channels 384, 384, 192, 96; 3x3x3 causal convolutions, 3 resnets a stage): 8.5
MFLOP per output pixel and frame, counted the same way."""
QWEN_IMAGE_VAE = VaeCosts(decoder=QWEN_IMAGE, encoder=QWEN_IMAGE_ENCODER, mflop_per_pixel=9.9)
"""Qwen-Image, Qwen-Image-Edit (`AutoencoderKLQwenImage`): Wan's VAE decoding one frame."""
QWEN_IMAGE_21_VAE = VaeCosts(decoder=QWEN_IMAGE_21, encoder=QWEN_IMAGE_21_ENCODER, mflop_per_pixel=16.2)
"""Qwen-Image 2.1 (`AutoencoderKLQwenImage21`): 16.2 MFLOP per output pixel, counted at 512^2 and 1024^2."""
HUNYUAN_VIDEO_VAE = VaeCosts(decoder=HUNYUAN_VIDEO, encoder=WAN_ENCODER, mflop_per_pixel=25.0)
"""HunyuanVideo (`AutoencoderKLHunyuanVideo`, channels 512, 512, 256, 128 with 3x3x3 convolutions): about 25 MFLOP
per output pixel and frame; its encoder, not counted, priced as Wan's."""
HUNYUAN_VIDEO15_VAE = VaeCosts(decoder=HUNYUAN_VIDEO15, encoder=HUNYUAN_VIDEO15_ENCODER, mflop_per_pixel=25.7)
"""HunyuanVideo 1.5 (`AutoencoderKLHunyuanVideo15`, channels 1024, 1024, 512, 256, 128; causal 3x3x3 convolutions,
3 resnets a stage): 25.4 to 26.4 MFLOP per output pixel and frame, counted on the meta device."""
LTX2_VIDEO_VAE = VaeCosts(decoder=LTX2_VIDEO, encoder=WAN_ENCODER, mflop_per_pixel=25.0)
"""LTX-2's video VAE (`AutoencoderKLLTX2Video`): priced as the heavy 3-D video decoders, its encoder as Wan's."""
COGVIDEOX_VAE = VaeCosts(decoder=COGVIDEOX, encoder=WAN_ENCODER, mflop_per_pixel=25.0)
"""CogVideoX and CogVideoX 1.5 (`AutoencoderKLCogVideoX`), planned only."""

VIDEO_DEFAULT, IMAGE_DEFAULT = WAN_VAE, IMAGE_VAE
"""The costs a VAE no family models is priced at: Wan's for video, the image VAE's for images."""
