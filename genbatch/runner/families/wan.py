"""Wan 2.1 / 2.2 text-to-video, as `diffusers.WanPipeline.__call__` runs it."""

from __future__ import annotations

import numpy as np
import torch

from genbatch.jobs.spec import JobSpec
from genbatch.runner.families.base import COND, UNCOND, Conditioning, Trajectory, classifier_free_guidance

MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default


class WanFamily:
    name = "wan"

    @staticmethod
    def _transformer_dtype(pipe) -> torch.dtype:
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        return model.dtype

    def encode(self, pipe, job: JobSpec, device: torch.device) -> Conditioning:
        use_cfg = job.guidance_scale > 1.0
        prompt_embeds, negative_embeds = pipe.encode_prompt(
            prompt=job.prompt,
            negative_prompt=job.negative_prompt,
            do_classifier_free_guidance=use_cfg,
            num_videos_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            device=device,
        )
        dtype = self._transformer_dtype(pipe)
        branches = {COND: {"encoder_hidden_states": prompt_embeds.to(dtype)}}
        if use_cfg:
            branches[UNCOND] = {"encoder_hidden_states": negative_embeds.to(dtype)}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator: torch.Generator, device: torch.device) -> Trajectory:
        pipe.scheduler.set_timesteps(job.num_inference_steps, device=device)
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        latents = pipe.prepare_latents(
            1, model.config.in_channels, job.height, job.width, job.num_frames, torch.float32, device, generator
        )
        pipe.scheduler.set_begin_index(0)
        boundary = pipe.config.boundary_ratio
        shared = {"boundary_timestep": boundary * pipe.scheduler.config.num_train_timesteps if boundary else None}
        return Trajectory(latents=latents, timesteps=pipe.scheduler.timesteps, shared=shared)

    def _model_at(self, pipe, trajectory: Trajectory, t):
        """Wan 2.2 switches to `transformer_2` below the boundary timestep (guidance_scale_2 = guidance_scale)."""
        boundary = trajectory.shared["boundary_timestep"]
        if boundary is None or t >= boundary:
            return pipe.transformer
        return pipe.transformer_2

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch) -> torch.Tensor:
        model = self._model_at(pipe, trajectory, t)
        model_input = latents.to(self._transformer_dtype(pipe))
        if pipe.config.expand_timesteps:
            # Wan 2.2 TI2V: one timestep per token. (b, c, f, h, w) -> (b, f * h/2 * w/2)
            mask = torch.ones(latents.shape, dtype=torch.float32, device=latents.device)
            timestep = (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(latents.shape[0], -1)
        else:
            timestep = t.expand(latents.shape[0])
        return model(hidden_states=model_input, timestep=timestep, return_dict=False, **branch)[0]

    def combine(self, predictions, guidance_scale: float, t) -> torch.Tensor:
        return classifier_free_guidance(predictions, guidance_scale)

    def vae_input(self, pipe, job: JobSpec, latents: torch.Tensor) -> torch.Tensor:
        vae = pipe.vae
        latents = latents.to(device=next(vae.parameters()).device, dtype=vae.dtype)
        z_dim = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        return latents / inv_std + mean

    def postprocess(self, pipe, decoded: torch.Tensor) -> np.ndarray:
        # (1, c, f, h, w) -> (f, h, w, c) in [0, 1]
        return pipe.video_processor.postprocess_video(decoded, output_type="np")[0]
