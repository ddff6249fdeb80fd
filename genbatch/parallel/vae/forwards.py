"""Which decoder (and encoder) modules need a tile-parallel forward, which run on a tile as they are, and the
`with` block that swaps those forwards in and restores them.

Which rule applies to which class is the model families' data (`ModelFamily.vae_classes` and
`ModelFamily.vae_rules`: class -> rule kind, see `genbatch.models.vae_rules`); this module implements each
kind (`KIND_RULES`) and joins the two into `RULES`. A class no family lists makes the VAE unsupported (the
caller falls back to a one-rank decode), so a new upstream layer can never silently give a wrong image.
Per-pixel and per-channel layers run unchanged; convolutions get halos, GroupNorm global statistics, the
mid-block attention a gathered key/value set.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
from diffusers.models.autoencoders import autoencoder_kl_wan as wan
from diffusers.models.resnet import ResnetBlock2D
from diffusers.models.downsampling import Downsample2D
from diffusers.models.upsampling import Upsample2D
from torch import nn

from genbatch.models import families, vae_rules
from genbatch.parallel.vae.attention import frame_causal_attention, image_attention, wan_attention
from genbatch.parallel.vae.context import TileGroup
from genbatch.parallel.vae.halo import convolution, extended_tile, halo_conv, pad_from_after, replicate_extended
from genbatch.parallel.vae.norms import group_norm

Check = Callable[[nn.Module], str | None]
Patch = Callable[[TileGroup, nn.Module], Callable | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """How one module class is decoded on tiles."""

    check: Check | None = None
    """Returns why this instance cannot be tiled (a configuration the rule does not cover), or None."""
    patch: Patch | None = None
    """Builds the tile-parallel forward for an instance (None from it: the instance runs as is)."""
    descend: bool = True
    """Whether the module's children are checked and patched too (False when `patch` replaces them all)."""


def _same_padding(kernel, padding, dilation, stride) -> str | None:
    if any(s != 1 for s in stride):
        return f"stride {tuple(stride)} (only stride 1 is tiled)"
    for k, p, d in zip(kernel, padding, dilation):
        if k % 2 == 0 or p != d * (k - 1) // 2:
            return f"kernel {tuple(kernel)} with padding {tuple(padding)} is not 'same' padding"
    return None


def _check_conv2d(conv: nn.Conv2d) -> str | None:
    if isinstance(conv.padding, str) or conv.padding_mode != "zeros":
        return f"padding {conv.padding!r} mode {conv.padding_mode!r} (only zero padding is tiled)"
    if tuple(conv.stride) == (2, 2) and tuple(conv.padding) == (0, 0) and tuple(conv.kernel_size) == (3, 3):
        return None  # Wan's downsampling: its input is the tile its halo pad extended by a row and a column
    return _same_padding(conv.kernel_size, conv.padding, conv.dilation, conv.stride)


def _check_halo_pad(pad: nn.ZeroPad2d) -> str | None:
    if tuple(pad.padding) != (0, 1, 0, 1):
        return f"padding {tuple(pad.padding)} (only (0, 1, 0, 1), before a stride-2 convolution, is tiled)"
    return None


def _patch_conv2d(group: TileGroup, conv: nn.Conv2d):
    ph, pw = conv.padding
    if ph == 0 and pw == 0:
        return None

    def run(x, pad_h, pad_w):
        return convolution(x, conv.weight, conv.bias, (1, 1), (pad_h, pad_w), conv.dilation, conv.groups)

    return lambda x: halo_conv(group, x, run, ph, pw)


def _check_causal_conv(conv: wan.WanCausalConv3d) -> str | None:
    pw, _, ph = conv._padding[:3]
    return _same_padding(conv.kernel_size[1:], (ph, pw), conv.dilation[1:], conv.stride[1:])


def _patch_causal_conv(group: TileGroup, conv: wan.WanCausalConv3d):
    pw, _, ph = conv._padding[:3]
    if ph == 0 and pw == 0:
        return None

    def run(x, pad_h, pad_w):
        return convolution(x, conv.weight, conv.bias, conv.stride, (0, pad_h, pad_w), conv.dilation, conv.groups)

    def forward(x, cache_x=None):
        # time as in WanCausalConv3d.forward: cached frames first, zeros for what the cache does not cover
        front, back = conv._padding[4:]
        if cache_x is not None and front > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            front -= cache_x.shape[2]
        if front or back:
            x = F.pad(x, (0, 0, 0, 0, front, back))
        return halo_conv(group, x, run, ph, pw)

    return forward


def _check_causal_conv2d(conv: nn.Conv2d) -> str | None:
    left, right, top, bottom = conv._padding
    if left != right or top != bottom:
        return f"padding {tuple(conv._padding)} (only the same padding on both sides is tiled)"
    return _same_padding(conv.kernel_size, (top, left), conv.dilation, conv.stride)


def _patch_causal_conv2d(group: TileGroup, conv: nn.Conv2d):
    left, _, top, _ = conv._padding
    if top == 0 and left == 0:
        return None

    def run(x, pad_h, pad_w):
        return convolution(x, conv.weight, conv.bias, conv.stride, (pad_h, pad_w), conv.dilation, conv.groups)

    def forward(x, cache_x=None):
        # as QwenImage21CausalConv3d.forward: the one frame (b, c, 1, h, w) convolved in 2-D with its zero padding
        if cache_x is not None:
            raise ValueError("this convolution folds its single frame away and takes no feature cache")
        return halo_conv(group, x.squeeze(2), run, top, left).unsqueeze(2)

    return forward


def _check_attention(attn: Attention) -> str | None:
    if type(attn.processor) is not AttnProcessor2_0:
        return f"attention processor {type(attn.processor).__name__} (only AttnProcessor2_0 is tiled)"
    if attn.spatial_norm is not None or attn.is_cross_attention:
        return "spatial-norm or cross attention"
    return None


def _check_resnet(block: ResnetBlock2D) -> str | None:
    if block.upsample is not None or block.downsample is not None or block.time_emb_proj is not None:
        return "resnet with its own up/down sampling or time embedding"
    return None


def _check_upsample(up: Upsample2D) -> str | None:
    if up.use_conv_transpose or not up.interpolate:
        return "transposed-convolution upsampling"
    return None


def _check_downsample(down: Downsample2D) -> str | None:
    if not down.use_conv or down.padding != 0 or down.norm is not None:
        return "downsampling by pooling, with padding or with a norm (only the unpadded stride-2 convolution is tiled)"
    return None


def _patch_downsample(group: TileGroup, down: Downsample2D):
    # Downsample2D.forward's (0, 1, 0, 1) pad, its row and column from the neighbours, then its convolution
    return lambda x, *args, **kwargs: down.conv(pad_from_after(group, x))


def _check_wan_resample(resample: wan.WanResample) -> str | None:
    if resample.mode in ("upsample2d", "upsample3d", "none"):
        return None
    if resample.mode in ("downsample2d", "downsample3d"):
        layers = list(resample.resample)
        if (len(layers) == 2 and isinstance(layers[0], nn.ZeroPad2d) and isinstance(layers[1], nn.Conv2d)
                and tuple(layers[1].stride) == (2, 2)):
            return None  # the halo pad, then the stride-2 convolution on the extended tile
        return f"a {resample.mode} of {[type(layer).__name__ for layer in layers]} (only ZeroPad2d, Conv2d is tiled)"
    return f"resample mode {resample.mode!r}"


def _check_ltx2_conv(conv: nn.Module) -> str | None:
    inner = conv.conv
    if tuple(inner.stride) != (1, 1, 1):
        return f"stride {tuple(inner.stride)} (only stride 1 is tiled)"
    if inner.padding_mode not in ("zeros", "reflect"):
        return f"spatial padding mode {inner.padding_mode!r}"
    return None


def _patch_ltx2_conv(group: TileGroup, conv: nn.Module):
    inner = conv.conv
    _, ph, pw = inner.padding
    if ph == 0 and pw == 0:
        return None
    reflect = inner.padding_mode == "reflect"

    def forward(hidden_states, causal=True):
        # time as in LTX2VideoCausalConv3d.forward: the first (and last) frame repeated
        kernel_t = conv.kernel_size[0]
        if causal:
            front = hidden_states[:, :, :1].repeat((1, 1, kernel_t - 1, 1, 1))
            hidden_states = torch.cat([front, hidden_states], dim=2)
        else:
            front = hidden_states[:, :, :1].repeat((1, 1, (kernel_t - 1) // 2, 1, 1))
            back = hidden_states[:, :, -1:].repeat((1, 1, (kernel_t - 1) // 2, 1, 1))
            hidden_states = torch.cat([front, hidden_states, back], dim=2)
        tile = extended_tile(group, hidden_states, ph, pw, reflect=reflect)
        return F.conv3d(tile, inner.weight, inner.bias, inner.stride, 0, inner.dilation, inner.groups)

    return forward


def _check_replicate_causal_conv(module: nn.Module) -> str | None:
    conv, pad = module.conv, module.time_causal_padding
    if module.pad_mode != "replicate":
        return f"pad mode {module.pad_mode!r} (only replicate padding is tiled by this rule)"
    if any(p != 0 for p in conv.padding) or conv.padding_mode != "zeros":
        return f"a convolution padded by itself ({tuple(conv.padding)}, {conv.padding_mode!r})"
    if pad[0] != pad[1] or pad[2] != pad[3] or pad[5] != 0:
        return f"padding {tuple(pad)} (only 'same' padding in height and width, causal in time, is tiled)"
    kernel_h, kernel_w = conv.kernel_size[1:]
    return _same_padding((kernel_h, kernel_w), (pad[2], pad[0]), conv.dilation[1:], conv.stride[1:])


def _patch_replicate_causal_conv(group: TileGroup, module: nn.Module):
    conv, pad = module.conv, module.time_causal_padding
    pw, ph, front = pad[0], pad[2], pad[4]

    def forward(x):
        # time as HunyuanVideo15CausalConv3d pads it (the whole clip is on every rank), then the tile's halos,
        # replicated only at the image's border: the window the whole image's replicate padding gives
        if front:
            x = F.pad(x, (0, 0, 0, 0, front, 0), mode="replicate")
        x = replicate_extended(group, x, ph, pw)
        return conv(x)  # the layer's own Conv3d (unpadded) on the extended tile

    return forward


def _check_ltx2_resnet(block: nn.Module) -> str | None:
    if block.per_channel_scale1 is not None or block.per_channel_scale2 is not None:
        return "noise injection (its noise is drawn at the whole frame's size)"
    return None


def _check_pointwise_conv(conv: nn.Module) -> str | None:
    if any(k != 1 for k in conv.kernel_size) or any(s != 1 for s in conv.stride) or any(p != 0 for p in conv.padding):
        return (f"kernel {tuple(conv.kernel_size)}, stride {tuple(conv.stride)}, padding {tuple(conv.padding)} "
                "(only a kernel of 1, unpadded, is tiled by this rule)")
    return None


KIND_RULES: dict[str, Rule] = {
    vae_rules.LOCAL: Rule(),
    vae_rules.RESNET: Rule(check=_check_resnet),
    vae_rules.UPSAMPLE: Rule(check=_check_upsample),
    vae_rules.DOWNSAMPLE: Rule(check=_check_downsample, patch=_patch_downsample, descend=False),
    vae_rules.WAN_RESAMPLE: Rule(check=_check_wan_resample),
    vae_rules.CONV2D: Rule(check=_check_conv2d, patch=_patch_conv2d),
    vae_rules.HALO_PAD: Rule(check=_check_halo_pad, patch=lambda group, pad: lambda x: pad_from_after(group, x)),
    vae_rules.CAUSAL_CONV3D: Rule(check=_check_causal_conv, patch=_patch_causal_conv),
    vae_rules.CAUSAL_CONV2D: Rule(check=_check_causal_conv2d, patch=_patch_causal_conv2d),
    vae_rules.GROUP_NORM: Rule(patch=lambda group, norm: lambda x: group_norm(group, norm, x)),
    vae_rules.LTX2_CONV3D: Rule(check=_check_ltx2_conv, patch=_patch_ltx2_conv, descend=False),
    vae_rules.LTX2_RESNET: Rule(check=_check_ltx2_resnet),
    vae_rules.WAN_ATTENTION: Rule(patch=lambda group, block: lambda x: wan_attention(group, block, x), descend=False),
    vae_rules.REPLICATE_CAUSAL_CONV3D: Rule(check=_check_replicate_causal_conv, patch=_patch_replicate_causal_conv,
                                            descend=False),
    vae_rules.POINTWISE_CONV: Rule(check=_check_pointwise_conv),
    vae_rules.FRAME_CAUSAL_ATTENTION: Rule(patch=lambda group, block: lambda x: frame_causal_attention(group, block, x),
                                           descend=False),
    vae_rules.IMAGE_ATTENTION: Rule(
        check=_check_attention,
        patch=lambda group, attn: lambda x, **kwargs: image_attention(group, attn, x, **kwargs),
        descend=False,
    ),
}
"""The implementation of each rule kind."""


def _class(qualified: str) -> type:
    """`module:Class` -> the class."""
    module, _, name = qualified.partition(":")
    return getattr(importlib.import_module(module), name)


def _family_rules() -> tuple[tuple[type, ...], dict[type, Rule]]:
    """(the VAE classes tile-parallel decode covers, module class -> its rule), from every family's data."""
    classes: dict[type, None] = {}
    rules: dict[type, Rule] = {}
    for family in families().values():
        classes.update(dict.fromkeys(_class(name) for name in family.vae_classes))
        for name, kind in family.vae_rules.items():
            cls = _class(name)
            if rules.get(cls, KIND_RULES[kind]) is not KIND_RULES[kind]:
                raise ValueError(f"two families give {name} different VAE rules; give it one rule kind")
            rules[cls] = KIND_RULES[kind]
    return tuple(classes), rules


VAE_CLASSES, RULES = _family_rules()
"""The VAE classes covered, and one rule per module class met in their decoders."""


def decoder_parts(vae: nn.Module) -> list[tuple[str, nn.Module]]:
    parts = [("decoder", vae.decoder)]
    if getattr(vae, "post_quant_conv", None) is not None:
        parts.insert(0, ("post_quant_conv", vae.post_quant_conv))
    return parts


def encoder_parts(vae: nn.Module) -> list[tuple[str, nn.Module]]:
    parts = [("encoder", vae.encoder)]
    if getattr(vae, "quant_conv", None) is not None:
        parts.append(("quant_conv", vae.quant_conv))
    return parts


Parts = Callable[[nn.Module], list[tuple[str, nn.Module]]]
"""The modules of a VAE one direction runs through (`decoder_parts`, `encoder_parts`)."""


def _walk(name: str, module: nn.Module) -> Iterator[tuple[str, nn.Module, Rule | None]]:
    rule = RULES.get(type(module))
    yield name, module, rule
    if rule is not None and rule.descend:
        for child_name, child in module.named_children():
            yield from _walk(f"{name}.{child_name}", child)


def unsupported_reason(vae: nn.Module, parts: Parts = decoder_parts) -> str | None:
    """Why `vae` cannot be decoded (or with `encoder_parts`, encoded) tile-parallel, naming the first module in
    the way; None if it can."""
    if not isinstance(vae, VAE_CLASSES):
        return f"{type(vae).__name__} is not {' or '.join(cls.__name__ for cls in VAE_CLASSES)}"
    for part, root in parts(vae):
        for name, module, rule in _walk(part, root):
            if rule is None:
                return f"{name} is a {type(module).__name__}, which tile-parallel decode does not know"
            reason = rule.check(module) if rule.check is not None else None
            if reason is None and rule.patch is not None and hasattr(module, "_hf_hook"):
                reason = "an accelerate hook (sequential CPU offload) wraps its forward; keep the VAE on the device"
            if reason is not None:
                return f"{name} ({type(module).__name__}): {reason}"
    return None


def supports_parallel_decode(vae: nn.Module) -> bool:
    """Whether `parallel_decode` can decode this VAE exactly on tiles."""
    return unsupported_reason(vae) is None


_UNSET = object()


@contextmanager
def tile_parallel(vae: nn.Module, group: TileGroup, parts: Parts = decoder_parts) -> Iterator[None]:
    """Within the block, `vae.decode(tile)` decodes this rank's latent tile as part of the whole image (with
    `encoder_parts`: `vae.encode(tile)` encodes this rank's pixel tile as part of the whole latent).

    Swaps the forward of the modules that need it on this VAE instance and turns its own tiling off;
    everything is restored on exit, so the same VAE decodes normally afterwards.
    """
    reason = unsupported_reason(vae, parts)
    if reason is not None:
        if parts is encoder_parts:
            raise ValueError(f"cannot encode tile-parallel: {reason}; encode on one rank (vae.encode) instead")
        raise ValueError(f"cannot decode tile-parallel: {reason}; use decode_fallback(vae, latents) instead")
    swapped: list[tuple[nn.Module, object]] = []
    use_tiling = getattr(vae, "use_tiling", False)
    try:
        for part, root in parts(vae):
            for _, module, rule in _walk(part, root):
                forward = rule.patch(group, module) if rule.patch is not None else None
                if forward is not None:
                    swapped.append((module, module.__dict__.get("forward", _UNSET)))
                    module.forward = forward
        vae.use_tiling = False
        yield
    finally:
        vae.use_tiling = use_tiling
        for module, previous in reversed(swapped):
            if previous is _UNSET:
                del module.forward
            else:
                module.forward = previous
