"""The decoders' mid-block self-attention, which sees the whole frame, on tiles.

The mid block runs at latent resolution, where the activation is small, so every rank gathers the whole
input, computes keys and values over all of it, and queries only for its own tile: the output tile equals
the tile of the whole-frame attention, and the attention work and memory per rank fall as 1/p.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genbatch.parallel.vae.context import TileGroup


def _own_tile(group: TileGroup, full: torch.Tensor, tile: torch.Tensor) -> torch.Tensor:
    """This rank's tile of `full`, at the resolution of `tile`."""
    top, bottom, left, right = group.grid_at(tile).bounds(group.rank)
    return full[..., top:bottom, left:right]


def wan_attention(group: TileGroup, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`WanAttentionBlock.forward` (one head, per frame, over the whole frame) on this rank's tile x (b, c, t, h, w)."""
    identity = x
    b, c, t, h, w = x.shape
    full = group.gather_full(x)
    height, width = full.shape[-2:]
    # (b, c, t, H, W) -> (b * t, c, H, W)
    full = full.permute(0, 2, 1, 3, 4).reshape(b * t, c, height, width)
    normed = block.norm(full)
    weight, bias = block.to_qkv.weight, block.to_qkv.bias
    q = F.conv2d(_own_tile(group, normed, x), weight[:c], bias[:c])
    kv = F.conv2d(normed, weight[c:], bias[c:])
    # (b * t, c, h, w) -> (b * t, 1, h * w, c)
    q = q.reshape(b * t, 1, c, h * w).permute(0, 1, 3, 2)
    # (b * t, 2c, H, W) -> (b * t, 1, H * W, 2c)
    kv = kv.reshape(b * t, 1, 2 * c, height * width).permute(0, 1, 3, 2)
    k, v = kv.chunk(2, dim=-1)
    out = F.scaled_dot_product_attention(q, k, v)
    # (b * t, 1, h * w, c) -> (b * t, c, h, w)
    out = out.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
    out = block.proj(out)
    # (b * t, c, h, w) -> (b, c, t, h, w)
    out = out.view(b, t, c, h, w).permute(0, 2, 1, 3, 4)
    return out + identity


def image_attention(group: TileGroup, attn: nn.Module, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """diffusers `Attention` with `AttnProcessor2_0` (AutoencoderKL's mid block) on this rank's tile x (b, c, h, w)."""
    if kwargs.get("encoder_hidden_states") is not None or kwargs.get("attention_mask") is not None:
        raise ValueError("tile-parallel decode supports the mid block's self-attention only (no context, no mask)")
    residual = x
    b, c, h, w = x.shape
    full = group.gather_full(x)
    if attn.group_norm is not None:
        norm = attn.group_norm
        full = F.group_norm(full, norm.num_groups, norm.weight, norm.bias, norm.eps)
    height, width = full.shape[-2:]
    # (b, c, H, W) -> (b, H * W, c)
    tokens = full.reshape(b, c, height * width).transpose(1, 2)
    # (b, c, h, w) -> (b, h * w, c)
    own = _own_tile(group, full, x).reshape(b, c, h * w).transpose(1, 2)
    query, key, value = attn.to_q(own), attn.to_k(tokens), attn.to_v(tokens)
    head_dim = key.shape[-1] // attn.heads
    # (b, s, heads * d) -> (b, heads, s, d)
    query = query.view(b, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(b, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(b, -1, attn.heads, head_dim).transpose(1, 2)
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
    # (b, heads, h * w, d) -> (b, h * w, heads * d)
    out = out.transpose(1, 2).reshape(b, -1, attn.heads * head_dim).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    # (b, h * w, c) -> (b, c, h, w)
    out = out.transpose(-1, -2).reshape(b, c, h, w)
    if attn.residual_connection:
        out = out + residual
    return out / attn.rescale_output_factor


def frame_causal_attention(group: TileGroup, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`HunyuanVideo15AttnBlock.forward` (one head over every frame's pixels, each frame attending to its own and
    the earlier frames' pixels) on this rank's tile x (b, c, t, h, w): keys and values over the gathered frames,
    queries of the tile, one frame at a time (the frames the block's causal mask lets it see, no mask built)."""
    identity = x
    b, c, t, h, w = x.shape
    full = group.gather_full(x)
    height, width = full.shape[-2:]
    normed = block.norm(full)  # per pixel over the channels: the tile's rows of the whole frame's
    q = block.to_q(_own_tile(group, normed, x))
    k, v = block.to_k(normed), block.to_v(normed)
    # (b, c, t, h, w) -> (b, 1, t * h * w, c)
    q = q.reshape(b, c, t * h * w).permute(0, 2, 1).unsqueeze(1)
    # (b, c, t, H, W) -> (b, 1, t * H * W, c)
    k = k.reshape(b, c, t * height * width).permute(0, 2, 1).unsqueeze(1)
    v = v.reshape(b, c, t * height * width).permute(0, 2, 1).unsqueeze(1)
    own, seen = h * w, height * width
    frames = [F.scaled_dot_product_attention(q[:, :, f * own:(f + 1) * own], k[:, :, :(f + 1) * seen],
                                             v[:, :, :(f + 1) * seen]) for f in range(t)]
    # t x (b, 1, h * w, c) -> (b, t * h * w, c) -> (b, c, t, h, w)
    out = torch.cat(frames, dim=2).squeeze(1).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
    return block.proj_out(out) + identity
