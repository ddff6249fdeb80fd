"""FLUX.1 text-to-image (guidance-distilled), as `diffusers.FluxPipeline.__call__` runs it."""

from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

from genbatch.jobs.spec import JobSpec
from genbatch.runner.families.base import COND, Conditioning, Trajectory

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline.__call__'s default


class FluxFamily:
    """FLUX.1 [dev]/[schnell]: one branch per step; the guidance scale is an input of the transformer."""

    name = "flux"

    def encode(self, pipe, job: JobSpec, device: torch.device) -> Conditioning:
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=job.prompt, prompt_2=None, device=device, num_images_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        branch = {"encoder_hidden_states": prompt_embeds, "pooled_projections": pooled, "txt_ids": text_ids}
        return Conditioning(branches={COND: branch}, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator: torch.Generator, device: torch.device) -> Trajectory:
        channels = pipe.transformer.config.in_channels // 4
        dtype = pipe.text_encoder_2.dtype if pipe.text_encoder_2 is not None else pipe.transformer.dtype
        latents, image_ids = pipe.prepare_latents(1, channels, job.height, job.width, dtype, device, generator)
        steps = job.num_inference_steps
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        config = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        guidance = None
        if pipe.transformer.config.guidance_embeds:
            guidance = torch.full([1], job.guidance_scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps, shared={"img_ids": image_ids, "guidance": guidance})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch) -> torch.Tensor:
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        return pipe.transformer(
            hidden_states=latents,
            timestep=timestep / 1000,
            guidance=trajectory.shared["guidance"],
            img_ids=trajectory.shared["img_ids"],
            joint_attention_kwargs={},
            return_dict=False,
            **branch,
        )[0]

    def combine(self, predictions, guidance_scale: float, t) -> torch.Tensor:
        return predictions[COND]

    def vae_input(self, pipe, job: JobSpec, latents: torch.Tensor) -> torch.Tensor:
        latents = pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor)
        latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        return latents.to(next(pipe.vae.parameters()).device)

    def postprocess(self, pipe, decoded: torch.Tensor) -> np.ndarray:
        # (1, c, h, w) -> (h, w, c) in [0, 1]
        return pipe.image_processor.postprocess(decoded, output_type="np")[0]
