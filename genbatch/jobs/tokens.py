"""`latent_shape` and `token_count`: the one derivation of a job's token count, shared by the cost estimate
(`genbatch.jobs.cost`), the planner and the runner's accounting (through `genbatch.models.spec.ModelSpec`)."""

from __future__ import annotations

import numpy as np


def latent_shape(width, height, num_frames, *, vae_spatial: int, vae_temporal: int, is_video: bool) -> tuple:
    """(frames, height, width) of the latent for video, (height, width) for images: the pixel sizes over the
    VAE's compression, rounded down as the pipelines' `prepare_latents` round; a video's latent frames are
    `(num_frames - 1) // vae_temporal + 1`. Ints or NumPy arrays (one entry per job)."""
    shape = [height // vae_spatial, width // vae_spatial]
    if is_video:
        shape.insert(0, (num_frames - 1) // vae_temporal + 1)
    return tuple(shape)


def token_count(latent: tuple, patch_size: tuple[int, ...]):
    """Image tokens the transformer sees for one sample: each latent extent over its patch, rounded down as
    the patch embedding (a convolution of stride `patch`, or the pipeline's 2x2 packing) produces, and at
    least one. Ints or NumPy arrays (one entry per job), in one order of operations for both."""
    count = 1 if not isinstance(latent[0], np.ndarray) else np.ones(len(latent[0]), dtype=np.int64)
    for extent, patch in zip(latent, patch_size[-len(latent) :]):
        count = count * (np.maximum(extent // patch, 1) if isinstance(extent, np.ndarray) else max(extent // patch, 1))
    return count
