"""Stable Diffusion 3 / 3.5 text-to-image, as `diffusers.StableDiffusion3Pipeline.__call__` runs it.

The pipeline batches the two guidance branches into one forward of batch 2; genbatch runs them as two
forwards so that CFG parallelism can put them on different ranks. The result equals the pipeline's within
float rounding (a batch-2 matmul is not always bit-identical to two batch-1 matmuls).
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift, retrieve_timesteps

from genbatch.jobs.spec import JobSpec
from genbatch.runner.families.base import COND, UNCOND, Conditioning, Trajectory, classifier_free_guidance

MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline.__call__'s default


class SD3Family:
    name = "sd3"

    def encode(self, pipe, job: JobSpec, device: torch.device) -> Conditioning:
        use_cfg = job.guidance_scale > 1.0
        embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
            prompt=job.prompt, prompt_2=None, prompt_3=None, device=device, num_images_per_prompt=1,
            do_classifier_free_guidance=use_cfg, negative_prompt=job.negative_prompt,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        branches = {COND: {"encoder_hidden_states": embeds, "pooled_projections": pooled}}
        if use_cfg:
            branches[UNCOND] = {"encoder_hidden_states": negative_embeds, "pooled_projections": negative_pooled}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator: torch.Generator, device: torch.device) -> Trajectory:
        transformer = pipe.transformer
        dtype = pipe.text_encoder.dtype if pipe.text_encoder is not None else transformer.dtype
        latents = pipe.prepare_latents(1, transformer.config.in_channels, job.height, job.width, dtype, device,
                                       generator)
        config = pipe.scheduler.config
        extra = {}
        if config.get("use_dynamic_shifting", None):
            patch = transformer.config.patch_size
            sequence = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            extra["mu"] = calculate_shift(sequence, config.get("base_image_seq_len", 256),
                                          config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                                          config.get("max_shift", 1.16))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, job.num_inference_steps, device, **extra)
        return Trajectory(latents=latents, timesteps=timesteps)

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch) -> torch.Tensor:
        return pipe.transformer(hidden_states=latents, timestep=t.expand(latents.shape[0]),
                                joint_attention_kwargs=None, return_dict=False, **branch)[0]

    def combine(self, predictions, guidance_scale: float, t) -> torch.Tensor:
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents: torch.Tensor) -> torch.Tensor:
        return latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor

    def postprocess(self, pipe, decoded: torch.Tensor) -> np.ndarray:
        # (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]
