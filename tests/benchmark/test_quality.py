"""PSNR and SSIM in NumPy: exact values on known cases, 1 / inf for identical inputs, lower for worse copies."""

import math

import numpy as np
import pytest

from genbatch.benchmark.quality import psnr, ssim


def test_psnr_of_known_errors():
    image = np.random.default_rng(0).integers(0, 250, (16, 16, 3)).astype(np.uint8)
    assert psnr(image, image, 255) == math.inf
    assert psnr(image + 1, image, 255) == pytest.approx(20 * math.log10(255))  # MSE 1


def test_ssim_is_one_for_equal_inputs_and_falls_with_noise():
    rng = np.random.default_rng(1)
    video = rng.random((2, 24, 24, 3))
    assert ssim(video, video, 1.0) == pytest.approx(1.0)
    slight, strong = video + 0.02 * rng.standard_normal(video.shape), video + 0.3 * rng.standard_normal(video.shape)
    assert 1.0 > ssim(slight, video, 1.0) > ssim(strong, video, 1.0) > 0.0
    assert ssim(video * 0.5 + 0.25, video, 1.0) < 1.0  # contrast change
    with pytest.raises(ValueError, match="at least 7"):
        ssim(video[:, :4], video[:, :4], 1.0)
