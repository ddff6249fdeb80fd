"""genbatch: offline batches of image and video generation with diffusion transformers, on GPU clusters."""

__version__ = "0.1.0"
