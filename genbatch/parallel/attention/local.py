"""Attention on one rank that also returns the log-sum-exp, and the online-softmax merge of two parts.

Layout is diffusers' (b, s, h, d). `lse[b, h, i] = log(sum_j exp(scale * q_i . k_j))` in fp32: two results
over disjoint key blocks merge exactly into the result over their union (`merge_attention`), which is what
Ring attention needs. Backends, picked by `backend="auto"`:

| backend     | device | when auto picks it                                   | kernel                                         |
|-------------|--------|------------------------------------------------------|------------------------------------------------|
| `cpu_flash` | CPU    | always on CPU                                        | aten `_scaled_dot_product_flash_attention_for_cpu` |
| `cudnn`     | CUDA   | sm90+ (Hopper and newer), fp16/bf16, head dim % 8 == 0 and <= 128 | aten `_scaled_dot_product_cudnn_attention` |
| `flash_attn`| CUDA   | flash-attn installed, fp16/bf16, head dim <= 256     | `flash_attn.flash_attn_func` (optional extra)   |
| `flash`     | CUDA   | fp16/bf16, head dim % 8 == 0 and <= 256, sm80+       | aten `_scaled_dot_product_flash_attention`      |
| `efficient` | CUDA   | otherwise when the head dim is aligned (8 fp16, 4 fp32) | aten `_scaled_dot_product_efficient_attention` |
| `math`      | any    | anything else                                        | explicit scores + logsumexp, fp32 (exact, O(s^2) memory) |

`auto` tries them in that order (`AUTO_ORDER`), fastest first: on Hopper, cuDNN's fused attention is the fastest
SDPA kernel (PyTorch made it the default there from 2.5); on Ampere and Ada it trails FlashAttention-2, so it
comes first only from sm90. `bench/gpu.sh` measures the kernels side by side on the GPU it runs on.

No `.item()` and no host sync: the choice depends only on dtype, device and shapes.

`--attention` names a kernel (`KERNELS`: the flag's spelling -> the backend); `kernel_problem` says why one
cannot run on a device, dtype and head size, and `check_kernel` turns that into the start-up error naming
the kernel `auto` would take there.

A key-padding mask (`key_mask`, (b, s_k) bool, True where a key may be attended to) becomes an additive
bias `(b, 1, 1, s_k)`: 0 for kept keys, -inf for padded ones. The flash kernels (and cuDNN here) take no
bias, so with a mask `auto` picks `cpu_flash` on CPU, `efficient` on CUDA and `math` elsewhere; a model whose
attention masks padded text (`AttentionSite.masked`) refuses them at start-up (`check_kernel(masked=True)`). A row whose keys are all padded
gets out 0 and lse -inf, so merging it with other blocks adds nothing.
"""

from __future__ import annotations

import functools
import importlib

import torch

BACKENDS = ("auto", "cpu_flash", "flash_attn", "flash", "cudnn", "efficient", "math")
KERNELS = {"auto": "auto", "flash-attn": "flash_attn", "cudnn": "cudnn", "flash": "flash", "efficient": "efficient",
           "math": "math", "cpu-flash": "cpu_flash"}
"""`--attention`'s values -> the backend `local_attention` runs."""
DIFFUSERS_BACKENDS = {"flash_attn": "flash", "cudnn": "_native_cudnn", "flash": "_native_flash",
                      "efficient": "_native_efficient", "math": "_native_math", "cpu_flash": "native"}
"""A backend -> diffusers' attention backend that runs the same kernel (for the attention sequence parallel
does not take over: every attention of a one-process run, and cross-attention to replicated text)."""
AUTO_ORDER = ("cudnn", "flash_attn", "flash", "efficient", "math")
"""The CUDA backends `auto` tries, fastest first; the first that can run is taken (`kernel_problem`)."""
MASKLESS = ("flash_attn", "flash", "cudnn")
"""Backends that take no key-padding mask."""
_HALF = (torch.float16, torch.bfloat16)


def set_diffusers_backend(model: torch.nn.Module, backend: str) -> None:
    """Make the attention calls of `model`'s own processors run `backend` (a `BACKENDS` name), for this
    model only. diffusers' `set_attention_backend` does the same and also changes the process-wide default
    backend, which would reach every other model the process builds (a later job's, a test's reference)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    name = AttentionBackendName(DIFFUSERS_BACKENDS[backend])
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            processor._attention_backend = name


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
    if q.device.type != "cuda":  # no import or device query off CUDA (compiled CPU code traces this)
        return auto_backend(q.device.type, q.dtype, q.shape[-1], None, False)
    return auto_backend("cuda", q.dtype, q.shape[-1], _capability(q.device), _flash_attn_func() is not None)


def auto_backend(device_type: str, dtype: torch.dtype, head_dim: int, capability: tuple[int, int] | None,
                 flash_attn: bool, masked: bool = False) -> str:
    """The backend `auto` takes for a device type, dtype and head size (`capability`: the CUDA device's;
    `flash_attn`: whether the optional extra is installed; `masked`: the attention carries a key-padding
    mask)."""
    if device_type == "cpu":
        return "cpu_flash"
    if device_type != "cuda":
        return "math"
    return next(name for name in AUTO_ORDER if not _auto_skips(name, capability)
                and kernel_problem(name, device_type, dtype, head_dim, capability, flash_attn, masked) is None)


def kernel_problem(backend: str, device_type: str, dtype: torch.dtype, head_dim: int,
                   capability: tuple[int, int] | None, flash_attn: bool, masked: bool = False) -> str | None:
    """Why `backend` cannot run attention of this device type, dtype and head size (with a key-padding mask
    when `masked`); None when it can."""
    half = dtype in _HALF
    if backend in ("auto", "math"):
        return None
    if masked and backend in MASKLESS:
        return "takes no key-padding mask, and this model's attention masks padded text tokens"
    if backend == "cpu_flash":
        return None if device_type == "cpu" else f"runs on CPUs only, not {device_type}"
    if device_type != "cuda":
        return f"needs a CUDA GPU (this run is on {device_type})"
    if backend == "efficient":
        return None if head_dim % (8 if half else 4) == 0 else f"needs a head dim divisible by {8 if half else 4}"
    if not half:
        return f"takes fp16 or bf16, not {str(dtype).removeprefix('torch.')} (pass --dtype bf16)"
    if backend == "flash_attn":
        if not flash_attn:
            return "needs the optional flash-attn package (pip install 'genbatch[flash]')"
        return None if head_dim <= 256 else "takes head dims up to 256"
    if capability is None or capability < (8, 0):
        return "needs an sm80 or newer GPU"
    if backend == "flash":
        return None if head_dim % 8 == 0 and head_dim <= 256 else "takes head dims divisible by 8, up to 256"
    if head_dim % 8 or head_dim > 128:  # cudnn
        return "takes head dims divisible by 8, up to 128"
    return None


def _auto_skips(backend: str, capability: tuple[int, int] | None) -> bool:
    """True where `auto` passes over a backend that can run because another is faster there: cuDNN before
    Hopper."""
    return backend == "cudnn" and (capability is None or capability < (9, 0))


def check_kernel(kernel: str, device: torch.device, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
    """The backend for `--attention kernel` on this device, dtype and head size (`masked`: the model's
    attention carries key-padding masks); ValueError naming a kernel that works when it cannot run."""
    if kernel not in KERNELS:
        raise ValueError(f"--attention {kernel} is not a kernel; use one of {', '.join(KERNELS)}")
    capability = _capability(device) if device.type == "cuda" else None
    flash_attn = _flash_attn_func() is not None
    backend = KERNELS[kernel]
    problem = kernel_problem(backend, device.type, dtype, head_dim, capability, flash_attn, masked)
    if problem is None:
        return backend
    works = {name: flag for flag, name in KERNELS.items()}[auto_backend(device.type, dtype, head_dim, capability,
                                                                         flash_attn, masked)]
    raise ValueError(f"--attention {kernel} {problem}; --attention {works} works for "
                     f"{str(dtype).removeprefix('torch.')} attention with head dim {head_dim} on {device.type}")


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
    elif backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, scale=scale)[:2]
        lse = lse.reshape(out.shape[:3])  # (b, h, s_q[, 1]) -> (b, h, s_q)
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
    if backend in MASKLESS:
        raise ValueError(f"backend {backend!r} takes no attention mask here; use 'auto', 'efficient' or 'math'")
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
