"""Quality of an approximate output against the exact one: PSNR and SSIM, in NumPy alone.

    psnr(ours, exact, peak)   10 log10(peak^2 / MSE) in dB; inf when equal
    ssim(ours, exact, peak)   the mean structural similarity over 7x7 windows (uniform weights, population
                              variances), per channel, of the last two spatial axes; 1 when equal

Both take images (h, w, c) or videos (frames, h, w, c) as any numeric arrays; `peak` is the data range (255
for uint8 pixels). Used by `bench/cache.py` (final latents of each cache mode against the exact run's).
"""

from __future__ import annotations

import math

import numpy as np

WINDOW = 7
"""SSIM's window side."""
K1, K2 = 0.01, 0.03
"""SSIM's stabilising constants (Wang et al. 2004)."""


def psnr(ours, exact, peak: float) -> float:
    ours, exact = np.asarray(ours, np.float64), np.asarray(exact, np.float64)
    if ours.shape != exact.shape:
        raise ValueError(f"PSNR of arrays of shapes {ours.shape} and {exact.shape}; compare outputs of one size")
    mse = float(np.mean((ours - exact) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)


def _box(values: np.ndarray) -> np.ndarray:
    """The mean over every WINDOW x WINDOW window of the last two axes ('valid': no padding)."""
    # (..., h, w) -> (..., h+1, w+1) summed-area table -> (..., h-W+1, w-W+1) window means
    table = np.pad(values, [(0, 0)] * (values.ndim - 2) + [(1, 0), (1, 0)]).cumsum(-2).cumsum(-1)
    w = WINDOW
    return (table[..., w:, w:] - table[..., :-w, w:] - table[..., w:, :-w] + table[..., :-w, :-w]) / (w * w)


def ssim(ours, exact, peak: float) -> float:
    ours, exact = np.asarray(ours, np.float64), np.asarray(exact, np.float64)
    if ours.shape != exact.shape or ours.ndim < 3 or min(ours.shape[-3:-1]) < WINDOW:
        raise ValueError(f"SSIM needs two (..., h, w, c) arrays of one shape, h and w at least {WINDOW}; got "
                         f"{ours.shape} and {exact.shape}")
    # (..., h, w, c) -> (..., c, h, w): windows slide over the spatial axes of each channel
    x, y = np.moveaxis(ours, -1, -3), np.moveaxis(exact, -1, -3)
    mx, my = _box(x), _box(y)
    vx, vy, cov = _box(x * x) - mx * mx, _box(y * y) - my * my, _box(x * y) - mx * my
    c1, c2 = (K1 * peak) ** 2, (K2 * peak) ** 2
    index = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(index.mean())
