"""What the pools' fork server imports once, before it forks each pool rank (tests/support/pool.py).

A rank spawned from scratch spends about 3.5 s of CPU importing torch, diffusers, transformers and genbatch
(`python -X importtime -c "import genbatch.runner.run"`); a rank forked from a server that imported them
starts at once. Only imports happen here: no tensor op, so no thread pool and no process group exists yet
at the fork. A name that fails to import costs only its rank's start-up, never the pool.
"""

from __future__ import annotations

import importlib

MODULES = (
    "torch", "torch.distributed", "torch.distributed.device_mesh", "torch.distributed.tensor",
    "torch.distributed.fsdp", "torch._dynamo", "numpy", "PIL.Image", "pyarrow.parquet", "fsspec",
    "diffusers", "transformers",
    "genbatch.runner.run", "genbatch.runner.presets", "genbatch.runner.world", "genbatch.io",
    "tests.support.distributed", "tests.support.runs",
)
DIFFUSERS_CLASSES = (  # the families' classes (genbatch/models/*.py import them lazily, by name)
    "AutoencoderKL", "AutoencoderKLWan", "AutoencoderKLHunyuanVideo", "AutoencoderKLQwenImage",
    "FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler",
    "FluxTransformer2DModel", "SD3Transformer2DModel", "WanTransformer3DModel", "HunyuanVideoTransformer3DModel",
    "QwenImageTransformer2DModel",
    "FluxPipeline", "FluxKontextPipeline", "StableDiffusion3Pipeline", "WanPipeline", "WanImageToVideoPipeline",
    "HunyuanVideoPipeline", "QwenImagePipeline",
)
TRANSFORMERS_CLASSES = (
    "CLIPTextModel", "CLIPTextModelWithProjection", "CLIPVisionModel", "T5EncoderModel", "UMT5EncoderModel",
    "LlamaModel", "Qwen2_5_VLForConditionalGeneration", "PreTrainedTokenizerFast",
)


def _load() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see the top
            pass
    for package, names in (("diffusers", DIFFUSERS_CLASSES), ("transformers", TRANSFORMERS_CLASSES)):
        try:
            module = importlib.import_module(package)
        except Exception:  # noqa: BLE001
            continue
        for name in names:
            try:
                getattr(module, name)  # the lazy module imports the class's own module
            except Exception:  # noqa: BLE001
                pass


_load()
