"""A job's estimated cost: transformer FLOPs over all its denoising steps, from the row alone.

Per step and branch, a DiT block costs about 24 N d^2 FLOPs in its linear layers (QKV, output, a 4x MLP)
and 4 N^2 d in attention, for N tokens of width d. The estimate orders jobs (largest first) and balances
work across data-parallel groups; only its ratios matter. The caller resolves the job's model once
(`genbatch.models.resolve_model`) and passes its spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from genbatch.jobs.tokens import latent_shape, token_count
from genbatch.jobs.spec import JobSpec

if TYPE_CHECKING:
    from genbatch.models.spec import ModelSpec  # a parameter's type: jobs sit below models


def estimated_flops(job: JobSpec, spec: ModelSpec) -> float:
    """The FLOPs of `job`, whose model is `spec`."""
    tokens = spec.tokens(job.width, job.height, job.num_frames)
    if spec.joint_text:
        tokens += spec.text_tokens  # joint attention over text and image tokens
    width = spec.hidden_size
    per_layer = 24.0 * tokens * width * width + 4.0 * tokens * tokens * width
    branches = 2 if _two_branches(spec, job.guidance_scale, job.negative_prompt is not None) else 1
    return per_layer * spec.num_layers * branches * job.num_inference_steps


def _two_branches(spec: ModelSpec, guidance_scale, has_negative_prompt):
    """Whether a job runs a second (unconditional) branch each step; scalars or NumPy arrays."""
    two = spec.uses_cfg & (np.asarray(guidance_scale, dtype=np.float64) > 1.0)
    return two & np.asarray(has_negative_prompt) if spec.cfg_needs_negative_prompt else two


def estimated_flops_array(spec, width, height, num_frames, num_inference_steps, guidance_scale,
                          has_negative_prompt=True) -> np.ndarray:
    """`estimated_flops` of many jobs of one model at once (NumPy arrays, one entry per job; `num_frames`
    is ignored for image models; `has_negative_prompt` matters to models whose second branch needs one),
    computed in the same order of operations, so the values are identical."""
    shape = latent_shape(width, height, num_frames, vae_spatial=spec.vae_spatial, vae_temporal=spec.frame_multiple,
                         is_video=spec.is_video)
    tokens = token_count(shape, spec.patch_size)
    if spec.joint_text:
        tokens = tokens + spec.text_tokens
    hidden = spec.hidden_size
    per_layer = 24.0 * tokens * hidden * hidden + 4.0 * tokens * tokens * hidden
    branches = np.where(_two_branches(spec, guidance_scale, has_negative_prompt), 2, 1)
    return per_layer * spec.num_layers * branches * num_inference_steps
