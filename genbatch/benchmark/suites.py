"""The benchmark suites: a model, a fixed manifest and the layouts to time it under.

    tiny  tiny-wan, 2 short clips, single + ulysses2       (tests: seconds)
    cpu   bench-wan, 2 clips of 33 frames at 256 px, 4 steps, single, dp2, ulysses2, ring2, cfg2
          (2 processes each on this kind of 2-core machine: a few minutes)
    gpu   Wan 2.1 1.3B architecture (random weights, bf16), 4 clips of 33 frames at 832x480, 10 steps,
          on the GPUs present: single, then dp/ulysses/ring/cfg over all of them
    tiny-qwen-image     the tiny-qwen-image preset, 2 images at 64 px with a negative prompt (true CFG: two
                        branches a step), single (tests: seconds)
    tiny-hunyuan-video  the tiny-hunyuan-video preset, 2 clips of 9 frames at 64x48, single (tests: seconds)
    flux       FLUX.1-dev architecture (random weights, bf16), 2 images at 1024x1024, 10 steps, embedded
               guidance 3.5, single (bench/gpu.sh's image case)
    tiny-flux  the tiny-flux preset, 2 images at 64 px, 4 steps, single (the same steps at tiny size)

The manifest is written into the report folder, so a report says exactly what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.benchmark.layouts import multi_device_layouts
from genbatch.benchmark.models import MODELS, BenchModel
from genbatch.parallel.dims import ParallelDims

PROMPTS = (
    "a lighthouse on a cliff at dusk, waves breaking below",
    "a red fox running through fresh snow in a pine forest",
    "a busy city street at night in the rain, neon reflections",
    "a hot air balloon rising over a green valley at sunrise",
    "a sailing boat crossing a calm bay under a cloudy sky",
    "a cat sleeping on a windowsill in the afternoon sun",
    "an old steam train crossing a stone bridge in autumn",
    "fireworks over a harbour, reflected in the water",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Suite:
    """What one `gen bench --suite NAME` runs."""

    name: str
    """The suite's name on the command line."""
    model: BenchModel
    """The model every job runs."""
    jobs: int
    """Rows in the manifest (at least the largest dp degree, so every group gets work)."""
    width: int
    height: int
    num_frames: int | None
    """Frames of each clip; None for an image model."""
    num_inference_steps: int
    guidance_scale: float = 5.0
    """Above 1: every step runs a conditional and an unconditional branch (CFG parallel applies), for a model
    whose guidance is CFG (Qwen-Image's true CFG also needs `negative_prompt`)."""
    negative_prompt: str | None = None
    """Every row's negative prompt (None: the column is left out)."""
    fps: int = 16
    layouts: tuple[ParallelDims, ...] = field(default_factory=tuple)
    """The layouts timed, in order; empty: derived from the GPUs present (`layouts_here`)."""

    def manifest_rows(self) -> list[dict]:
        """The suite's manifest: `jobs` rows of the same geometry, distinct prompts and seeds."""
        video = {} if self.num_frames is None else {"num_frames": self.num_frames, "fps": self.fps}
        negative = {} if self.negative_prompt is None else {"negative_prompt": self.negative_prompt}
        return [
            {"id": f"{self.name}-{index:02d}", "prompt": PROMPTS[index % len(PROMPTS)], "seed": 1000 + index,
             "width": self.width, "height": self.height, "num_inference_steps": self.num_inference_steps,
             "guidance_scale": self.guidance_scale, **video, **negative}
            for index in range(self.jobs)
        ]

    def summary(self) -> str:
        """One line for `gen bench --help`: the model, the work and the layouts, e.g. `tiny-wan, 2 jobs of
        64x48 x 9 frames, 4 steps; layouts single, ulysses2`."""
        frames = "" if self.num_frames is None else f" x {self.num_frames} frames"
        layouts = (f"layouts {', '.join(layout.name for layout in self.layouts)}" if self.layouts
                   else "the layouts the visible GPUs allow")
        return (f"{self.model.name}, {self.jobs} jobs of {self.width}x{self.height}{frames}, "
                f"{self.num_inference_steps} steps; {layouts}")

    def layouts_here(self) -> list[ParallelDims]:
        """The suite's layouts; for the GPU suite, the ones the visible GPUs allow."""
        if self.layouts:
            return list(self.layouts)
        import torch

        devices = torch.cuda.device_count()
        if devices == 0:
            raise ValueError(f"suite {self.name!r} runs on GPUs and none is visible; use --suite cpu on this machine")
        return multi_device_layouts(devices, self.model.num_heads, uses_cfg=self.guidance_scale > 1)


SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite(name="tiny", model=MODELS["tiny-wan"], jobs=2, width=64, height=48, num_frames=9,
              num_inference_steps=4, fps=8, layouts=(ParallelDims(), ParallelDims(ulysses=2))),
        Suite(name="cpu", model=MODELS["bench-wan"], jobs=2, width=256, height=256, num_frames=33,
              num_inference_steps=4,
              layouts=(ParallelDims(), ParallelDims(dp=2), ParallelDims(ulysses=2), ParallelDims(ring=2),
                       ParallelDims(cfg=2))),
        Suite(name="gpu", model=MODELS["wan2.1-1.3b-random"], jobs=4, width=832, height=480, num_frames=33,
              num_inference_steps=10),
        Suite(name="tiny-qwen-image", model=MODELS["tiny-qwen-image"], jobs=2, width=64, height=64, num_frames=None,
              num_inference_steps=4, guidance_scale=4.0, negative_prompt="blurry, low quality",
              layouts=(ParallelDims(),)),
        Suite(name="tiny-hunyuan-video", model=MODELS["tiny-hunyuan-video"], jobs=2, width=64, height=48,
              num_frames=9, num_inference_steps=4, guidance_scale=6.0, fps=8, layouts=(ParallelDims(),)),
        Suite(name="flux", model=MODELS["flux.1-dev-random"], jobs=2, width=1024, height=1024, num_frames=None,
              num_inference_steps=10, guidance_scale=3.5, layouts=(ParallelDims(),)),
        Suite(name="tiny-flux", model=MODELS["tiny-flux"], jobs=2, width=64, height=64, num_frames=None,
              num_inference_steps=4, guidance_scale=3.5, layouts=(ParallelDims(),)),
    )
}


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}") from None
