"""Attention on one rank that also returns the log-sum-exp, and the online-softmax merge of two parts.

Layout is diffusers' (b, s, h, d). `lse[b, h, i] = log(sum_j exp(scale * q_i . k_j))` in fp32: two results
over disjoint key blocks merge exactly into the result over their union (`merge_attention`), which is what
Ring attention needs. Backends, picked by `backend="auto"`:

| backend     | device | when auto picks it                                   | kernel                                         |
|-------------|--------|------------------------------------------------------|------------------------------------------------|
| `cpu_flash` | CPU    | always on CPU                                        | aten `_scaled_dot_product_flash_attention_for_cpu` |
| `flash_attn`| CUDA   | flash-attn installed, fp16/bf16, head dim <= 256     | `flash_attn.flash_attn_func` (optional extra)   |
| `flash`     | CUDA   | fp16/bf16, head dim % 8 == 0 and <= 256, sm80+       | aten `_scaled_dot_product_flash_attention`      |
| `efficient` | CUDA   | otherwise when the head dim is aligned (8 fp16, 4 fp32) | aten `_scaled_dot_product_efficient_attention` |
| `math`      | any    | anything else                                        | explicit scores + logsumexp, fp32 (exact, O(s^2) memory) |

No `.item()` and no host sync: the choice depends only on dtype, device and shapes.

A key-padding mask (`key_mask`, (b, s_k) bool, True where a key may be attended to) becomes an additive
bias `(b, 1, 1, s_k)`: 0 for kept keys, -inf for padded ones. Flash kernels take no bias, so with a mask
`auto` picks `cpu_flash` on CPU, `efficient` on CUDA and `math` elsewhere. A row whose keys are all padded
gets out 0 and lse -inf, so merging it with other blocks adds nothing.
"""

from __future__ import annotations

import functools
import importlib

import torch

BACKENDS = ("auto", "cpu_flash", "flash_attn", "flash", "efficient", "math")
_HALF = (torch.float16, torch.bfloat16)


@functools.cache
def _flash_attn_func():
    """flash-attn's `flash_attn_func` when the optional extra is installed, else None (imported once)."""
    try:
        return importlib.import_module("flash_attn").flash_attn_func
    except ImportError:
        return None


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def pick_backend(q: torch.Tensor) -> str:
    """The backend `auto` uses for this query tensor (b, s, h, d)."""
    head_dim = q.shape[-1]
    if q.device.type == "cpu":
        return "cpu_flash"
    if q.device.type != "cuda":
        return "math"
    if q.dtype in _HALF and head_dim <= 256 and _flash_attn_func() is not None:
        return "flash_attn"
    if q.dtype in _HALF and head_dim % 8 == 0 and head_dim <= 256 and _capability(q.device) >= (8, 0):
        return "flash"
    if head_dim % (8 if q.dtype in _HALF else 4) == 0:
        return "efficient"
    return "math"


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention: q (b, s_q, h, d), k/v (b, s_k, h, d) -> out (b, s_q, h, d) in q's dtype and lse
    (b, h, s_q) fp32. `scale` defaults to 1/sqrt(d); `key_mask` (b, s_k) bool drops padded keys. An empty
    (or wholly padded) key block gives out 0 and lse -inf."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is unknown; use one of {BACKENDS}")
    b, s_q, h, _ = q.shape
    if s_q == 0 or k.shape[1] == 0:  # the kernels divide by zero on empty blocks
        out = q.new_zeros((b, s_q, h, v.shape[-1]))
        return out, q.new_full((b, h, s_q), float("-inf"), dtype=torch.float32)
    if key_mask is not None:
        return _masked_attention(q, k, v, key_mask, scale, backend)
    if backend == "auto":
        backend = pick_backend(q)
    if backend == "flash_attn":
        flash = _flash_attn_func()
        if flash is None:
            raise ValueError("backend 'flash_attn' needs the optional extra: pip install 'genbatch[flash]'")
        out, lse, _ = flash(q, k, v, softmax_scale=scale, return_attn_probs=True)
        return out, lse.float()
    # (b, s, h, d) -> (b, h, s, d): the layout the aten kernels take (views, no copy)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if backend == "cpu_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, scale=scale)
    elif backend == "flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, scale=scale)[:2]
    elif backend == "efficient":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(qt, kt, vt, None, True, scale=scale)[:2]
        lse = lse[..., :s_q]  # some versions pad the lse's sequence dim to a multiple of 32
    else:
        out, lse = _math_attention(qt, kt, vt, scale)
    # (b, h, s_q, d) -> (b, s_q, h, d)
    return out.transpose(1, 2).to(q.dtype), lse.float()


def _masked_attention(q, k, v, key_mask, scale, backend):
    """`local_attention` with a key-padding mask (b, s_k) bool; see the module docstring."""
    if key_mask.shape != (q.shape[0], k.shape[1]) or key_mask.dtype != torch.bool:
        raise ValueError(
            f"key_mask must be bool (batch, keys) = {(q.shape[0], k.shape[1])}, got {key_mask.dtype} "
            f"{tuple(key_mask.shape)}; build it with genbatch.parallel.attention.masks.key_padding"
        )
    if backend == "auto":
        backend = {"cpu": "cpu_flash", "cuda": "efficient"}.get(q.device.type, "math")
    if backend in ("flash", "flash_attn"):
        raise ValueError(f"backend {backend!r} takes no attention mask; use 'auto', 'efficient' or 'math'")
    # (b, s_k) -> (b, 1, 1, s_k): 0 where a key is kept, -inf where it is padding
    bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~key_mask, float("-inf"))
    bias = bias[:, None, None, :]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (b, s, h, d) -> (b, h, s, d)
    if backend == "cpu_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, attn_mask=bias, scale=scale)
    elif backend == "efficient":
        b, h, s_q, s_k = qt.shape[0], qt.shape[1], qt.shape[2], kt.shape[2]
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            qt, kt, vt, bias.expand(b, h, s_q, s_k), True, scale=scale
        )[:2]
        lse = lse[..., :s_q]
    else:
        out, lse = _math_attention(qt, kt, vt, scale, bias)
    # a row with no key to attend to: out 0 and lse -inf (the kernels give lse 0 or nan there)
    attends = key_mask.any(dim=1)[:, None, None]  # (b,) -> (b, 1, 1), broadcast over heads and queries
    lse = torch.where(attends, lse.float(), float("-inf"))
    out = torch.where(attends[..., None], out, 0.0)
    # (b, h, s_q, d) -> (b, s_q, h, d)
    return out.transpose(1, 2).to(q.dtype), lse


def _math_attention(qt, kt, vt, scale, bias=None):
    """Exact reference path in fp32 on (b, h, s, d) inputs: returns out (b, h, s_q, d) and lse (b, h, s_q)."""
    scale = qt.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(qt.float(), kt.float().transpose(-1, -2)) * scale  # (b, h, s_q, s_k)
    if bias is not None:
        scores = scores + bias.float()
    out = torch.matmul(torch.softmax(scores, dim=-1), vt.float())  # max-subtracted: exact to fp32 rounding
    return out, torch.logsumexp(scores, dim=-1)


def merge_attention(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online-softmax merge of two partial results over disjoint key blocks, in fp32.

    out (b, s, h, d) fp32 is updated in place (the caller owns it); lse (b, h, s) fp32. The merged output
    is `out + sigmoid(block_lse - lse) * (block_out - out)`, the weights being each part's share of the
    total softmax mass, and the merged lse is `logaddexp(lse, block_lse)`.
    """
    # (b, h, s) -> (b, s, h, 1): the share of the new block, broadcast over d
    share = torch.sigmoid(block_lse - lse).transpose(1, 2).unsqueeze(-1)
    out.lerp_(block_out.to(out.dtype), share)
    return out, torch.logaddexp(lse, block_lse)
