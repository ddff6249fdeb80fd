"""Quality of an approximate output against the exact one: PSNR and SSIM, in NumPy alone.

    psnr(ours, exact, peak)   10 log10(peak^2 / MSE) in dB; inf when equal
    ssim(ours, exact, peak)   the mean structural similarity over 7x7 windows (uniform weights, population
                              variances), per channel, of the last two spatial axes; 1 when equal

Both take images (h, w, c) or videos (frames, h, w, c) as any numeric arrays; `peak` is the data range (255
for uint8 pixels). `bench/cache.py` scores each cache mode's final latents against the exact run's; `gen bench
--cache MODE` scores every layout's outputs against one exact run of the same seeds (`output_quality`), `gen
bench --quantization fp8|int8` against one unquantized run of them, and a PSNR that falls by more than
`QUALITY_DROP_DB` against the baseline is a regression (`quality_regressed`).
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


PSNR_CAP_DB = 100.0
"""PSNR given to identical outputs (inf in the formula), so means and JSON stay finite."""
QUALITY_DROP_DB = 1.0
"""A layout whose mean PSNR fell by more than this against the baseline's is a regression."""
QUALITY_METRICS = ("psnr_db", "ssim")
"""The quality metrics of a layout, higher is better."""


def output_quality(exact_url: str, run_url: str, storage_options: dict | None = None) -> dict[str, float] | None:
    """Mean PSNR (capped at `PSNR_CAP_DB`) and SSIM of a run's outputs against the exact run's, over the outputs
    both have (the same ids, hence the same seeds); None when they share none. Pixels are uint8 (peak 255)."""
    from genbatch.io import decode_mp4, decode_png
    from genbatch.io.options import open_filesystem

    fs, exact_root, _ = open_filesystem(exact_url, storage_options)
    _, run_root, _ = open_filesystem(run_url, storage_options)
    names = sorted(path.rsplit("/", 1)[-1] for path in fs.glob(f"{exact_root}/outputs/*"))
    scores = []
    for name in names:
        if not fs.exists(f"{run_root}/outputs/{name}"):
            continue
        decode = decode_mp4 if name.endswith(".mp4") else decode_png
        exact = decode(fs.cat_file(f"{exact_root}/outputs/{name}"))
        ours = decode(fs.cat_file(f"{run_root}/outputs/{name}"))
        scores.append((min(psnr(ours, exact, 255.0), PSNR_CAP_DB), ssim(ours, exact, 255.0)))
    if not scores:
        return None
    return {"psnr_db": float(np.mean([s[0] for s in scores])), "ssim": float(np.mean([s[1] for s in scores])),
            "jobs": len(scores)}


def quality_regressed(metric: str, baseline: float, current: float) -> bool:
    """PSNR regresses when it falls by more than `QUALITY_DROP_DB`; SSIM is reported, never a verdict."""
    return metric == "psnr_db" and current < baseline - QUALITY_DROP_DB


def load_quality(url: str, storage_options: dict | None = None) -> dict[str, dict[str, float]]:
    """A report's quality by layout (`OUT/quality.json`); {} for a report without one."""
    import json

    from genbatch.io.options import open_filesystem

    fs, root, _ = open_filesystem(url, storage_options)
    path = f"{root}/quality.json"
    return json.loads(fs.cat_file(path)) if fs.isfile(path) else {}


def cache_mode(run_args: tuple[str, ...]) -> str | None:
    """The approximate `--cache` mode among a bench's `gen run` arguments (None: none, or exact)."""
    args = list(run_args)
    mode = args[args.index("--cache") + 1] if "--cache" in args[:-1] else None
    return None if mode in (None, "none") else mode


def batch_size_of(run_args: tuple[str, ...]) -> int | str:
    """The `--batch-size` among a bench's `gen run` arguments (1 when not given). The exact run keeps it, so a
    step cache under batches is scored against exact batches of the same rows."""
    args = list(run_args)
    if "--batch-size" not in args[:-1]:
        return 1
    value = args[args.index("--batch-size") + 1]
    return value if value == "auto" else int(value)


def quantization_of(run_args: tuple[str, ...]) -> str:
    """The quantization among a bench's `gen run` arguments, as run.json records it (`fp8`, `int8+text-encoders`;
    `none` when there is none)."""
    args = list(run_args)
    kind = args[args.index("--quantization") + 1] if "--quantization" in args[:-1] else "none"
    return kind + ("+text-encoders" if kind != "none" and "--quantize-text-encoder" in args else "")


def without_cache(run_args: tuple[str, ...]) -> tuple[str, ...]:
    """The same `gen run` arguments for the exact configuration: `--cache MODE` and `--quantization KIND` (with
    `--quantize-text-encoder`) left out, so the reference runs every step whole with the weights in the run's
    dtype."""
    args = list(run_args)
    for flag in ("--cache", "--quantization"):
        if flag in args[:-1]:
            index = args.index(flag)
            del args[index:index + 2]
    return tuple(arg for arg in args if arg != "--quantize-text-encoder")
