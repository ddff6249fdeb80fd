"""A job's estimated cost: transformer FLOPs over all its denoising steps, from the row alone.

Per step and branch, a DiT block costs about 24 N d^2 FLOPs in its linear layers (QKV, output, a 4x MLP)
and 4 N^2 d in attention, for N tokens of width d. The estimate orders jobs (largest first) and balances
work across data-parallel groups; only its ratios matter.
"""

from __future__ import annotations

from genbatch.jobs.models import resolve_model
from genbatch.jobs.spec import JobSpec


def estimated_flops(job: JobSpec) -> float:
    spec = resolve_model(job.model)
    tokens = spec.tokens(job.width, job.height, job.num_frames)
    if spec.family in ("flux", "sd3"):
        tokens += spec.text_tokens  # joint attention over text and image tokens
    width = spec.hidden_size
    per_layer = 24.0 * tokens * width * width + 4.0 * tokens * tokens * width
    branches = 2 if spec.uses_cfg and job.guidance_scale > 1.0 else 1
    return per_layer * spec.num_layers * branches * job.num_inference_steps
