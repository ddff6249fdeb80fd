"""A few-step night: every layout runs the suite with a distilled LoRA at its own steps and guidance.

    recipe = FewStepRecipe(lora=run_loras(("/loras/wan_4step.safetensors",), ()), steps=4, guidance=1.0)
    recipe.rows(suite.manifest_rows())   # the suite's rows at 4 steps, guidance 1 (one branch a step)
    recipe.run_args()                    # --lora URI --lora-scale S ... --media-allow DIR (the adapter's folder)

The base model's own output (no LoRA, the suite's steps and guidance, the same seeds) is the reference each
layout is scored against (PSNR / SSIM, `genbatch.benchmark.nightly`). A distilled LoRA is a different model,
not an approximation of the base one: its scores say how far its outputs are from the base model's, and the
report says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from genbatch.jobs.lora import LoraRef


@dataclass(frozen=True, slots=True)
class FewStepRecipe:
    lora: tuple[LoraRef, ...]
    """The adapters every row runs with (run-level `--lora`, absolute URIs or hub ids)."""
    steps: int = 4
    """Denoising steps of every row."""
    guidance: float = 1.0
    """Guidance scale of every row (1: one branch a step, as distilled LoRAs are run)."""

    def __post_init__(self) -> None:
        if not self.lora:
            raise ValueError("a few-step night needs its LoRA: pass --lora URI (the distilled adapter)")
        if self.steps < 1 or self.guidance < 0:
            raise ValueError(f"--lora-steps {self.steps} and --lora-guidance {self.guidance}: use steps >= 1 and "
                             "guidance >= 0, e.g. --lora-steps 4 --lora-guidance 1")

    def rows(self, suite_rows: list[dict]) -> list[dict]:
        """The suite's rows at the recipe's steps and guidance (the adapters come from `run_args`)."""
        return [{**row, "num_inference_steps": self.steps, "guidance_scale": self.guidance} for row in suite_rows]

    def run_args(self) -> tuple[str, ...]:
        """`gen run` arguments: each adapter and its scale, and each local adapter's folder allowed as media
        (the manifest is in OUT, the adapter is not)."""
        args: list[str] = []
        for ref in self.lora:
            args += ["--lora", ref.uri, "--lora-scale", repr(ref.scale)]
        for folder in dict.fromkeys(os.path.dirname(ref.uri.rstrip("/")) for ref in self.lora if not ref.is_hub_id):
            args += ["--media-allow", folder]
        return tuple(args)

    def describe(self, base_steps: int, base_guidance: float) -> str:
        adapters = ", ".join(f"`{ref.uri}` at {ref.scale:g}" for ref in self.lora)
        return (f"LoRA {adapters}, {self.steps} steps, guidance {self.guidance:g}: a different (distilled) model "
                f"from the base, not a cache; scored against the base model's own {base_steps}-step output at "
                f"guidance {base_guidance:g}")
