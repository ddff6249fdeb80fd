"""`gen run`'s options, in typed groups, built from its flags in one place (`RunOptions.from_flags`).

    RunOptions(manifest, out,
               model=ModelOptions(...),      the model for rows that name none, row defaults, dtype, how it runs
               layout=LayoutOptions(...),    the degrees (or auto), the process group, the stale methods, the decode
               storage=StorageOptions(...),  fsspec options and timeout, what rows' media may read, uploads in flight
               resume=ResumeOptions(...),    checkpoints, attempts, the share and the hand-out
               features=FeatureOptions(...), batches and the embedding cache
               report=..., quiet=...)        what the run says and writes when it ends
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from genbatch.jobs.quantization import Quantization, parse_quantization
from genbatch.jobs.spec import JobOverrides
from genbatch.parallel.dims import LayoutRequest
from genbatch.runner.checkpoint import CheckpointPolicy

if TYPE_CHECKING:
    from genbatch.io.media_policy import MediaPolicy
    from genbatch.parallel.compile import CompileConfig
    from genbatch.parallel.config import ParallelizeConfig
    from genbatch.runner.compile_cache import CompileCache
    from genbatch.runner.world import World


class UsageError(ValueError):
    """Options that cannot run (a bad layout, an unreadable manifest): exit status 2, nothing runs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelOptions:
    """The model of rows that name none, the rows' defaults, and how the model runs."""

    model: str | None = None
    """The run's model for rows without a `model` value: a preset name, a pipeline directory or a hub id (None:
    every row must name its own, or the run stops with exit 2 naming --model)."""
    overrides: JobOverrides = field(default_factory=JobOverrides)
    """Run-level defaults for rows that leave a setting empty."""
    dtype: str | None = None
    """fp32 / bf16 / fp16 (None: bf16 on GPUs, fp32 on the CPU)."""
    download: bool | None = None
    """Download hub models missing from the Hugging Face cache (one rank per node); None: unless HF_HUB_OFFLINE."""
    attention: str = "auto"
    """The attention kernel (`genbatch.parallel.flags.ATTENTION_KERNELS`), checked at start-up."""
    compile: bool = False
    """torch.compile each repeated transformer block's forward (`genbatch.parallel.compile`)."""
    compile_backend: str = "inductor"
    """The torch.compile backend for `compile` (`genbatch.parallel.flags.COMPILE_BACKENDS`)."""
    compile_cache: str | None = None
    """Where compiled artifacts are kept across runs (any fsspec URL; None: OUT/compile-cache)."""
    text_encoder_parallel: str = "auto"
    """How the text encoders run over a job group (`genbatch.parallel.tensor.encoders.MODES`)."""
    quantization: Quantization = field(default_factory=Quantization)
    """`--quantization` and `--quantize-text-encoder`: the weights torchao quantizes at load
    (`genbatch.parallel.quantize`)."""

    def __post_init__(self) -> None:
        if self.quantization.text_encoders and self.text_encoder_parallel in ("tp", "fsdp"):
            raise ValueError(f"--quantize-text-encoder with --text-encoder-parallel {self.text_encoder_parallel}: "
                             "torchao's quantized weights do not split under DTensor or shard under FSDP; use "
                             "--text-encoder-parallel replicate (or auto, which replicates quantized encoders), or "
                             "drop --quantize-text-encoder")

    @property
    def text_encoders(self) -> str:
        """How the text encoders run: `--text-encoder-parallel`, with `auto` as `replicate` for quantized encoders
        (whole on every rank, at the quantized width)."""
        if self.quantization.text_encoders and self.text_encoder_parallel == "auto":
            return "replicate"
        return self.text_encoder_parallel

    def row_defaults(self) -> JobOverrides:
        """The defaults for rows that leave a setting empty: the run-level overrides, with `model` as the model
        of rows that name none (what the run-level checks and the manifest's validation both apply)."""
        return self.overrides if self.overrides.model is not None else replace(self.overrides, model=self.model)

    def compile_config(self) -> CompileConfig | None:
        """The `CompileConfig` step 4 of the parallelisation order applies (None: no compile)."""
        if not self.compile:
            return None
        from genbatch.jobs.cache import TAYLORSEER, parse_cache
        from genbatch.parallel.compile import CompileConfig

        taylorseer = parse_cache(self.overrides.cache).kind == TAYLORSEER  # its hooks sit inside the blocks
        return CompileConfig(backend=self.compile_backend, breaks=taylorseer)

    def parallelize_config(self) -> ParallelizeConfig:
        """The `ParallelizeConfig` the parallelisation order applies (`genbatch.parallel.config`)."""
        from genbatch.parallel.config import ParallelizeConfig

        return ParallelizeConfig(compile=self.compile_config(), attention=self.attention,
                                 text_encoders=self.text_encoders, cache=self.overrides.cache,
                                 quantization=self.quantization)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutOptions:
    """How the run's processes are laid out and what the layout's methods need."""

    request: LayoutRequest | str = field(default_factory=LayoutRequest)
    """The degrees asked for (`parallel/dims.LayoutRequest`), or "auto": `gen plan`'s best layout for these
    processes."""
    profile: str | None = None
    """With "auto": the calibration profile (name or path) the planner prices layouts with."""
    backend: str | None = None
    """torch.distributed backend (None: nccl with GPUs, gloo otherwise)."""
    collective_timeout: float = 600.0
    """Seconds a collective may wait for a peer before the job fails, naming the missing rank."""
    warmup_steps: int | None = None
    """Synchronous (exact) steps at the start of each job under --distrifusion or --pipefusion (None: the
    method's default: 4, 1)."""
    patches: int | None = None
    """PipeFusion's patches (None: as many as stages)."""
    vae_decode: str = "auto"
    """How each job's VAE decodes (`genbatch.runner.decode`): auto, full, tiled or parallel."""
    vae_memory_gib: float | None = None
    """GiB a rank may fill, for `auto`'s choice of decode mode (None: the device's memory)."""

    def flags(self) -> dict:
        """The layout flags as run.json records them: every axis and fsdp, or `layout: auto`."""
        return {"layout": "auto"} if isinstance(self.request, str) else self.request.flags()


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageOptions:
    """Where the run reads and writes, how long a failing store is waited for, and what rows may read."""

    options: Mapping[str, Any] = field(default_factory=dict)
    """fsspec options for the manifest and the output URLs (endpoint, credentials, ...)."""
    timeout: float = 120.0
    """Seconds one storage operation may keep failing, every retry included, before the run stops with its state
    kept (exit 75); permanent errors (access denied, no such bucket) stop it at once (exit 2)."""
    media_allow: tuple[str, ...] = ()
    """URL prefixes rows' media may be read from besides the manifest's own directory and the hub cache
    (`--media-allow`; `genbatch.io.media_policy`)."""
    media_max_mib: float = 64.0
    """The most MiB one row's input image may have (`--media-max-mib`)."""
    media_refuse: tuple[str, ...] = ()
    """Networks never read over http(s), besides link-local and metadata addresses (`--media-refuse`)."""
    max_pending_writes: int = 4
    """Finished jobs whose uploads may be in flight while the next job runs."""

    def media_policy(self, manifest: str) -> MediaPolicy:
        """What the rows of `manifest` may read (`genbatch.io.media_policy.MediaPolicy`)."""
        from genbatch.io.media_policy import MediaPolicy

        return MediaPolicy.for_manifest(manifest, allow=self.media_allow, max_mib=self.media_max_mib,
                                        refuse=self.media_refuse)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeOptions:
    """What a run keeps to continue after a stop, and which jobs it takes."""

    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """When a running job saves its denoising state."""
    max_attempts: int = 3
    """Run attempts a failing job is tried in; one that has failed in this many is not tried again."""
    share: tuple[int, int] | None = None
    """Run only this (index, count) share of the manifest (job arrays)."""
    dynamic_hand_out: bool = True
    """Hand jobs to whichever group is free (False: a static strided split)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FeatureOptions:
    """How rows are grouped and what each rank keeps between them."""

    batch_size: int | str = 1
    """Rows run in one forward (`genbatch.jobs.batches`), or `auto` (`genbatch.runner.auto_batch`)."""
    embedding_cache_gib: float = 2.0
    """GiB of prompt encodes each rank keeps (`genbatch.runner.embeddings`; 0: none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOptions:
    """Everything `gen run` was asked for."""

    manifest: str
    """The manifest's URL (any fsspec URL)."""
    out: str
    """Where the run writes (any fsspec URL)."""
    model: ModelOptions = field(default_factory=ModelOptions)
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    storage: StorageOptions = field(default_factory=StorageOptions)
    resume: ResumeOptions = field(default_factory=ResumeOptions)
    features: FeatureOptions = field(default_factory=FeatureOptions)
    report: bool = False
    """Write `gen report`'s gallery to OUT/report/ when the run ends (rank 0, after the results table)."""
    quiet: bool = False
    """No progress bar or summary."""

    def media_policy(self) -> MediaPolicy:
        """What this run's rows may read."""
        return self.storage.media_policy(self.manifest)

    def compile_cache_for(self, world: World) -> CompileCache | None:
        """The run's `CompileCache` for this layout (None without `--compile`)."""
        if not self.model.compile:
            return None
        from genbatch.runner.compile_cache import CompileCache, artifact_name

        name = artifact_name(layout=world.ctx.dims.name, dtype=world.dtype, device=world.ctx.device,
                             backend=self.model.compile_backend)
        return CompileCache(url=self.model.compile_cache or f"{self.out.rstrip('/')}/compile-cache", name=name,
                            storage_options=dict(self.storage.options))

    def recorded(self) -> dict:
        """The options run.json records (`options`)."""
        layout, model = self.layout, self.model
        return {**layout.flags(), "warmup_steps": layout.warmup_steps, "patches": layout.patches,
                "share": self.resume.share, "vae_decode": layout.vae_decode, "vae_memory_gib": layout.vae_memory_gib,
                "compile": model.compile, "compile_backend": model.compile_backend, "attention": model.attention,
                "compile_cache": model.compile_cache, "text_encoder_parallel": model.text_encoder_parallel,
                "quantization": model.quantization.kind, "quantize_text_encoder": model.quantization.text_encoders,
                "media_allow": self.storage.media_allow, "media_max_mib": self.storage.media_max_mib,
                "media_refuse": self.storage.media_refuse, "batch_size": self.features.batch_size,
                "embedding_cache_gib": self.features.embedding_cache_gib}

    @classmethod
    def from_flags(cls, manifest: str, out: str, flags: Mapping[str, Any]) -> RunOptions:
        """The options of `gen run`'s flags (click's parameter names; a flag left out keeps its default);
        UsageError naming the flag and the fix for a value that cannot run."""
        from genbatch.manifests.cli import overrides_from_options

        get = flags.get
        try:
            return cls(
                manifest=manifest, out=out,
                model=_group(ModelOptions, flags, {
                    "model": "model", "dtype": "dtype", "download": "download", "attention": "attention",
                    "compile": "compile", "compile_backend": "compile_backend", "compile_cache": "compile_cache",
                    "text_encoder_parallel": "text_encoder_parallel"},
                    overrides=overrides_from_options(dict(flags)),
                    quantization=parse_quantization(get("quantization"), get("quantize_text_encoder", False))),
                layout=_group(LayoutOptions, flags, {
                    "profile": "profile", "backend": "backend", "collective_timeout": "collective_timeout",
                    "warmup_steps": "warmup_steps", "patches": "patches", "vae_decode": "vae_decode",
                    "vae_memory_gib": "vae_memory"},
                    request=_layout_request(flags)),
                storage=_group(StorageOptions, flags, {"timeout": "storage_timeout", "media_max_mib": "media_max_mib"},
                               options=_storage_options(get("storage_option") or ()),
                               media_allow=tuple(get("media_allow") or ()),
                               media_refuse=_networks(get("media_refuse") or ())),
                resume=_group(ResumeOptions, flags, {"max_attempts": "max_attempts"}, share=_share(get("share")),
                              dynamic_hand_out=get("hand_out", "dynamic") == "dynamic",
                              checkpoints=_checkpoints(flags)),
                features=_group(FeatureOptions, flags, {"batch_size": "batch_size",
                                                        "embedding_cache_gib": "embedding_cache_gib"}),
                report=bool(get("report", False)), quiet=bool(get("quiet", False)),
            )
        except ValueError as error:
            raise UsageError(str(error)) from None


def _group(kind: type, flags: Mapping[str, Any], names: Mapping[str, str], **values: Any):
    """`kind(**values)`, with each field in `names` from the flag it names (a flag left out, or None, keeps the
    field's default)."""
    found = {field_name: flags[flag] for field_name, flag in names.items() if flags.get(flag) is not None}
    return kind(**found, **values)


def _layout_request(flags: Mapping[str, Any]) -> LayoutRequest | str:
    """The degrees asked for, or "auto"; with `--profile` only under `--layout auto`, that profile loads, and
    the text encoders' mode fits `--fsdp`."""
    from genbatch.parallel.tensor.encoders import check_mode

    auto = flags.get("layout") == "auto"
    if flags.get("profile") is not None:
        if not auto:
            raise ValueError("--profile prices the layouts --layout auto chooses from: add --layout auto")
        from genbatch.planner.profile import load_profile

        load_profile(flags["profile"])  # a missing or broken profile fails now, not on the ranks
    check_mode(flags.get("text_encoder_parallel") or "auto", fsdp=bool(flags.get("fsdp")))
    if auto:
        return "auto"
    from genbatch.parallel.axes import GROUP_AXES

    return LayoutRequest.of(dp=flags.get("dp"), fsdp=bool(flags.get("fsdp")),
                            **{axis: flags.get(axis) for axis in GROUP_AXES})


def _storage_options(pairs) -> dict:
    from genbatch.io.options import parse_storage_options

    return parse_storage_options(tuple(pairs))


def _networks(values) -> tuple[str, ...]:
    from genbatch.io.media_policy import parse_networks

    return tuple(str(network) for network in parse_networks(values))


def _share(text: str | None) -> tuple[int, int] | None:
    """`--share K/N`, else the Slurm job array's share (None: the whole manifest)."""
    from genbatch.cluster.slurm_env import array_share
    from genbatch.jobs.schedule import parse_share

    return parse_share(text) if text else array_share()


def _checkpoints(flags: Mapping[str, Any]) -> CheckpointPolicy:
    if isinstance(flags.get("checkpoints"), CheckpointPolicy):
        return flags["checkpoints"]
    defaults = CheckpointPolicy()
    every = flags.get("checkpoint_every")
    seconds = flags.get("checkpoint_seconds")
    return CheckpointPolicy(every_steps=defaults.every_steps if every is None else every,
                            every_seconds=defaults.every_seconds if seconds is None else seconds)
