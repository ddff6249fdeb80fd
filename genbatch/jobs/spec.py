"""One fully resolved job, and the run-level options that fill what a manifest row leaves out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from genbatch.jobs.cache import NONE, parse_cache
from genbatch.jobs.lora import LoraRef

# The per-job settings a manifest row, a run-level option or the model's defaults can supply, in the order
# results tables list them.
SETTINGS = ("width", "height", "num_frames", "num_inference_steps", "guidance_scale", "fps")
# Settings that only mean something for video models.
VIDEO_SETTINGS = ("num_frames", "fps")


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """One manifest row with every setting resolved (row value > run-level option > model default)."""

    id: str
    """The row's unique id; names the outputs (`outputs/<id>.png`) and the done marker."""
    prompt: str
    """The text prompt."""
    negative_prompt: str | None
    """The negative prompt, or None for the pipeline's own (none)."""
    model: str
    """The model the job runs on: a preset name or a diffusers pipeline directory."""
    width: int
    """Output width in pixels."""
    height: int
    """Output height in pixels."""
    num_frames: int | None
    """Frames of a video; None for image models."""
    num_inference_steps: int
    """Denoising steps."""
    guidance_scale: float
    """Classifier-free guidance scale (or the distilled guidance embedding for FLUX)."""
    seed: int
    """The noise seed: the row's own, or derived from `id` (see `genbatch.jobs.seeds`)."""
    fps: int | None
    """Frames per second of a video; None for image models."""
    # ---- the per-row inputs' fields (`genbatch.jobs.inputs`: each input's `job_fields` fills its own) ----
    cache: str = NONE
    """The job's step-caching mode in canonical form (`genbatch.jobs.inputs.cache`)."""
    image: str | None = None
    """The conditioning image's URL (absolute: a relative manifest value is taken from the manifest's
    directory, `genbatch.jobs.inputs.media`), or None."""
    last_image: str | None = None
    """First-and-last-frame video: the last frame's URL, or None."""
    lora: tuple[LoraRef, ...] = ()
    """The adapters the job applies, in order (`genbatch.jobs.inputs.lora`)."""
    audio: bool | None = None
    """Whether the video carries its sound (`genbatch.jobs.inputs.audio`: resolved for every row of a manifest);
    None: the model's way (sound where the model makes it)."""
    extra: dict[str, object] = field(default_factory=dict)
    """The manifest's extra columns for this row, as Python values, carried into the results table."""
    row: int
    """0-based row index in the manifest."""
    source_id: str | None = None
    """The manifest row's id when the job is one of its `num_outputs` (`id` is then `<source_id>-k`); None
    when the job is the row itself, whose id it keeps. Results rows carry it as `source_id` (the id there)."""

    def record(self) -> dict[str, object]:
        """A flat dict for results tables: the job's fields, each input's record, then its extra columns."""
        from genbatch.jobs.inputs import ROW_INPUTS

        flat: dict[str, object] = {
            "id": self.id,
            "source_id": self.id if self.source_id is None else self.source_id,
            "row": self.row,
            "model": self.model,
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "seed": self.seed,
        }
        for name in SETTINGS:
            flat[name] = getattr(self, name)
        for row_input in ROW_INPUTS:
            flat.update(row_input.record(self))
        flat.update(self.extra)
        return flat


@dataclass(kw_only=True, slots=True)
class JobOverrides:
    """Run-level options (`gen run` / `gen validate` flags); each applies to rows that leave the column null."""

    model: str | None = None
    """The run's model for rows without a `model` value; None means the caller's default."""
    width: int | None = None
    """Width in pixels for rows without one."""
    height: int | None = None
    """Height in pixels for rows without one."""
    num_frames: int | None = None
    """Frames for video rows without one (ignored for image models)."""
    num_inference_steps: int | None = None
    """Denoising steps for rows without a value."""
    guidance_scale: float | None = None
    """Guidance scale for rows without a value."""
    fps: int | None = None
    """Frames per second for video rows without one (ignored for image models)."""
    cache: str | None = None
    """The step-caching mode for rows without a `cache` value (`genbatch.jobs.cache`); None: `none`."""
    lora: tuple[LoraRef, ...] = ()
    """The adapters of rows whose `lora` is null (`--lora`, `--lora-scale`)."""

    def __post_init__(self) -> None:
        for name in ("width", "height", "num_frames", "num_inference_steps", "fps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"run-level {name}={value!r} must be a positive integer; pass e.g. {name}=16")
        guidance = self.guidance_scale
        if guidance is not None and not (
            isinstance(guidance, (int, float)) and math.isfinite(guidance) and guidance >= 0
        ):
            raise ValueError(f"run-level guidance_scale={guidance!r} must be a finite number >= 0; pass e.g. 5.0")
        if self.cache is not None:
            parse_cache(self.cache)  # ValueError naming the value and the modes that run
        if self.model is not None and not self.model.strip():
            raise ValueError(
                "run-level model is empty; pass a name `gen models` lists, a hub id or a pipeline directory"
            )

    def record(self) -> dict[str, object]:
        """The options as JSON values (run.json's `overrides`); `from_record` reads them back."""
        return {name: [adapter.as_dict() for adapter in self.lora] if name == "lora" else getattr(self, name)
                for name in self.__slots__}

    @classmethod
    def from_record(cls, values: dict) -> JobOverrides:
        known = {name: values[name] for name in cls.__slots__ if name in values}
        known["lora"] = tuple(LoraRef(**adapter) for adapter in known.get("lora") or ())
        return cls(**known)

    def value(self, name: str) -> int | float | None:
        """The run-level value of one setting (see `SETTINGS`), None when not given."""
        return getattr(self, name)
