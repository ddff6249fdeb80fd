"""Parallelising a pipeline for a job group, in a fixed order (model code stays upstream, untouched).

The whole order, fixed: each step is filled in at its place (`apply_before_fsdp`, and `shard_pipeline` for step
5), never elsewhere:

    1. stage split (pp)    PipeFusion: the transformer's blocks cut into `pp` stages at the model's stage
                           boundaries; each rank keeps its stage's blocks
    2. TP and SP splits    tensor parallel: the family's `TensorSplits` (diffusers' `_tp_plan` where it has
                           one) splits heads, MLP columns and the AdaLN modulation over `tp`
                           (`parallel.tensor`); then sequence parallel: split/gather hooks and the routed
                           attention (`parallel.sequence`) on each denoiser (ring x ulysses), which then
                           sees each rank's heads/tp; or, under distrifusion, the same hooks over the patch
                           ranks with the stale-K/V strategy (`parallel.patch`)
    2b. quantization       `--quantization fp8|int8`: torchao quantizes the denoisers' Linear layers (this
                           stage's blocks only, under pp) and, with `--quantize-text-encoder`, the text
                           encoders' (`parallel.quantize`), after the plans (the split and gather hooks sit on
                           modules, not weights) and before compile, which traces the quantized matmuls. Its
                           tensors do not shard under DTensor or `fully_shard`, so the axis table refuses tp
                           and fsdp beside it; a pipeline whose weights are filled after the plans
                           (`runner.loading.load_tensor_parallel_pipeline`) is quantized once filled
    3. cache hooks         not installed here: step caching is per job (`--cache`, a row's `cache`), so
                           `genbatch.parallel.cache.StepCache` hooks the repeated blocks when each job
                           starts and removes the hooks when it ends. They replace the blocks' `forward`
                           (diffusers' HookRegistry), which by then is the compiled forward of step 4
                           and sits inside FSDP's per-block hooks of step 5: so the cache hooks wrap
                           the compiled blocks from outside (TaylorSeer's sit inside them and run
                           eagerly, the blocks compiled around them, `parallel.cache.taylorseer`), and a
                           skipped span's decision is agreed over the group (`parallel.cache.agreement`)
    4. compile             `--compile`: torch.compile of each compile unit's forward (the family's
                           repeated blocks, `parallel/compile.py`), after the splits and hooks above so
                           that it traces through them, before FSDP so that FSDP's all-gathers stay
                           outside the compiled regions
    5. FSDP2               fully_shard per block, then the root, on transformers and text encoders, over
                           `ctx.fsdp_mesh` (the job group minus tp and pp), filled from the group leader's
                           weights (the runner builds the components on the meta device and loads the
                           leader's copy: `genbatch.runner.loading.load_sharded_pipeline`)

CFG parallel lives in the denoise loop (`genbatch.parallel.cfg`) and patch-parallel VAE decode in the
decode step (`genbatch.parallel.vae`): they need no change to the modules.
"""

from __future__ import annotations

import torch

from genbatch.models.spec import ModelSpec
from genbatch.models import family
from genbatch.parallel import fsdp
from genbatch.parallel.comm import Comm
from genbatch.parallel.compile import CompileConfig, compile_units
from genbatch.parallel.config import ParallelizeConfig
from genbatch.parallel.context import ParallelContext
from genbatch.parallel.sequence import SequenceGroup, SequenceParallel
from genbatch.parallel.tensor import encoders

TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")
"""diffusers' component names for a pipeline's text encoders."""


def denoisers(spec: ModelSpec) -> tuple[str, ...]:
    """Pipeline components that run the denoising forward (sequence parallel applies to them): the family's."""
    return family(spec.family).denoisers


def sharded(spec: ModelSpec, text_encoders: str = "auto") -> tuple[str, ...]:
    """Pipeline components whose weights FSDP shards under --fsdp: the denoisers, and each text encoder that
    `--text-encoder-parallel` (`text_encoders`) does not keep out (tp, replicate, or `auto` for an encoder at
    least 4096 wide, which it splits); the VAE is small and replicated. Names the pipeline lacks are skipped."""
    return denoisers(spec) + tuple(name for name in TEXT_ENCODERS if encoders.sharded_by_fsdp(
        text_encoders, encoders.config_width(spec.path, name), fsdp=True))


def _components(pipe, names) -> list[tuple[str, torch.nn.Module]]:
    return [(name, getattr(pipe, name)) for name in names if getattr(pipe, name, None) is not None]


def sequence_group(ctx: ParallelContext, attention: str = "auto") -> SequenceGroup:
    return SequenceGroup(ulysses=ctx.ulysses, ring=ctx.ring, sp=ctx.sp, kernel=attention)


def apply_attention_kernel(pipe, spec: ModelSpec, attention: str) -> None:
    """The denoisers' own attention calls (diffusers' dispatch) run the `attention` backend (`auto`: unchanged)."""
    if attention == "auto":
        return
    from genbatch.parallel.attention.local import set_diffusers_backend

    for _, model in _components(pipe, denoisers(spec)):
        set_diffusers_backend(model, attention)


def apply_tensor_parallel(pipe, spec: ModelSpec, ctx: ParallelContext) -> None:
    """Split each denoiser over the tp group by its family's tensor splits (nothing at tp 1)."""
    if ctx.dims.tp == 1:
        return
    from genbatch.parallel.tensor.shard import tensor_parallel

    record = family(spec.family)
    for _, model in _components(pipe, denoisers(spec)):
        splits = record.transformer_parts(type(model).__name__).tensor_splits
        if splits is None:
            raise ValueError(f"{type(model).__name__} has no tensor splits; run {spec.name} with --tp 1")
        tensor_parallel(model, splits, ctx.tp_comm, ctx.tp_mesh)


def apply_text_encoder_parallel(pipe, spec: ModelSpec, ctx: ParallelContext, requested: str = "auto") -> None:
    """Split the text encoders `--text-encoder-parallel` (`requested`) picks over the job group, each by its
    family's splits for its class (nothing on a group of one rank)."""
    if ctx.group.size == 1:
        return
    from genbatch.parallel.tensor.shard import tensor_parallel

    by_class = family(spec.family).text_encoder_splits
    for name, encoder in _components(pipe, TEXT_ENCODERS):
        if not encoders.splits(requested, encoder, fsdp=ctx.dims.fsdp):
            continue
        splits = by_class.get(type(encoder).__name__)
        if splits is None:
            raise ValueError(f"{name} ({type(encoder).__name__}) has no tensor splits; use --text-encoder-parallel "
                             "replicate (or fsdp with --fsdp)")
        tensor_parallel(encoder, splits, ctx.group, ctx.group_mesh,
                        flag=f"--text-encoder-parallel tp over the {ctx.group.size} ranks of a job group")


def patch_group(ctx: ParallelContext, attention: str = "auto") -> SequenceGroup:
    """The distrifusion axis as a sequence group of one dimension: each rank one patch of every split stream."""
    patches, solo = ctx.patch_comm, Comm(None, ctx.ledger)
    return SequenceGroup(ulysses=patches, ring=solo, sp=patches, kernel=attention)


def apply_sequence_parallel(pipe, spec: ModelSpec, ctx: ParallelContext, attention: str = "auto"
                            ) -> list[SequenceParallel]:
    """Sequence parallel on each denoiser: exact over ring x ulysses, or DistriFusion's stale-K/V attention over
    the distrifusion axis (the same split and gather points: each rank one patch)."""
    if ctx.dims.distrifusion > 1:
        from genbatch.parallel.patch import strategies  # registers the strategy

        group, strategy = patch_group(ctx, attention), strategies.StalePatchAttention.name
    elif ctx.dims.pp > 1:  # the stale-K/V buffers of patch forwards, over each stage's sequence ranks
        from genbatch.parallel.pipeline.patches import PATCHES, PatchHooks
        from genbatch.parallel.pipeline.strategy import PIPEFUSION

        group = sequence_group(ctx, attention)
        parallel = [SequenceParallel(model, group, PIPEFUSION) for _, model in _components(pipe, denoisers(spec))]
        for sequence in parallel:  # the patch cut runs before the split hooks, the placing after the gathers
            PATCHES.put(sequence.model, PatchHooks(sequence.model))
        return parallel
    elif ctx.dims.sp > 1:
        group, strategy = sequence_group(ctx, attention), None
    else:
        return []
    return [SequenceParallel(model, group, strategy) for _, model in _components(pipe, denoisers(spec))]


def apply_stage_split(pipe, spec: ModelSpec, ctx: ParallelContext) -> list[tuple[torch.nn.Module, object, list]]:
    """Cut each denoiser's repeated blocks into the pp stages, keeping this rank's (nothing at pp 1); returns
    (model, parts, kept blocks) for `link_stages`."""
    if ctx.dims.pp == 1:
        return []
    from genbatch.parallel.pipeline.stages import cut_stages

    record, cut = family(spec.family), []
    for _, model in _components(pipe, denoisers(spec)):
        parts = record.transformer_parts(type(model).__name__)
        cut.append((model, parts, cut_stages(model, parts, ctx.pp_comm.rank, ctx.dims.pp)))
    return cut


def link_stages(stages: list[tuple[torch.nn.Module, object, list]], ctx: ParallelContext) -> None:
    """Join the cut denoisers' stages point to point over the pp group."""
    from genbatch.parallel.pipeline.stages import StageLink

    for model, parts, blocks in stages:
        StageLink(model, parts, blocks, ctx.pp_comm)


def apply_compile(pipe, spec: ModelSpec, ctx: ParallelContext, config: CompileConfig) -> None:
    """Compile each denoiser's compile units in place; under ring > 1 the P2P exchange breaks the graph, except
    under pp > 1, whose stale-K/V attention (its ring passes included) is one opaque node, as DistriFusion's is; a
    stage's P2P sends are hooks outside its blocks."""
    record = family(spec.family)
    for _, model in _components(pipe, denoisers(spec)):
        units = record.transformer_parts(type(model).__name__).compile_units
        opaque_ring = ctx.dims.ring == 1 or ctx.dims.pp > 1
        compile_units(model, units, config, fullgraph=opaque_ring and not config.breaks)


def quantized_components(pipe, spec: ModelSpec, config: ParallelizeConfig) -> tuple[str, ...]:
    """The components step 2b quantizes: the denoisers, and the text encoders with `--quantize-text-encoder`
    (none without a quantization); names the pipeline lacks are left out."""
    quantization = config.quantization
    if not quantization.enabled:
        return ()
    names = denoisers(spec) + (TEXT_ENCODERS if quantization.text_encoders else ())
    return tuple(name for name, _ in _components(pipe, names))


def apply_quantization(pipe, spec: ModelSpec, ctx: ParallelContext, config: ParallelizeConfig) -> dict[str, int]:
    """Step 2b: each of `quantized_components` quantized in place on this rank's device (its Linear layers, every
    one of them or a RuntimeError); the layers quantized by component."""
    from genbatch.parallel.quantize import quantize

    return {name: quantize(getattr(pipe, name), config.quantization.kind, ctx.device)
            for name in quantized_components(pipe, spec, config)}


def apply_before_fsdp(pipe, spec: ModelSpec, ctx: ParallelContext, config: ParallelizeConfig = ParallelizeConfig(),
                quantize: bool = True) -> None:
    """Steps 1-4 of the order, on every rank's copy of the pipeline (whole, or a meta-built skeleton), with the
    run's `config`: how step 4 compiles, the attention kernel (checked at start-up), the text encoders' mode
    for step 2 and the quantization of step 2b (`quantize` False: the caller quantizes once it has filled the
    weights)."""
    compile, attention, text_encoders = config.compile, config.attention_backend, config.text_encoders
    # 1. stage split (pp): each rank keeps its stage's share of the denoisers' repeated blocks
    stages = apply_stage_split(pipe, spec, ctx)
    # 2. tensor-parallel splits, then the sequence-parallel splits (the attention kernel first: sequence
    #    parallel routes over the processors it set; the attention modules already count heads/tp)
    apply_tensor_parallel(pipe, spec, ctx)
    apply_text_encoder_parallel(pipe, spec, ctx, text_encoders)
    apply_attention_kernel(pipe, spec, attention)
    apply_sequence_parallel(pipe, spec, ctx, attention)
    #    the stages' point-to-point joins go on after the split hooks: a stage's first block takes the received
    #    activations in place of the inputs the split hooks cut (those of the stage's own embeddings)
    link_stages(stages, ctx)
    # 2b. quantization: the Linear layers this rank holds (its stage's blocks), before compile traces them
    if quantize:
        apply_quantization(pipe, spec, ctx, config)
    # 3. cache hooks: per job, around the compiled blocks (`parallel.cache.StepCache`), not here
    # 4. compile the family's compile units
    if compile is not None:
        apply_compile(pipe, spec, ctx, compile)


def parallelize_pipeline(pipe, spec: ModelSpec, ctx: ParallelContext,
                         config: ParallelizeConfig = ParallelizeConfig(), quantize: bool = True) -> None:
    """The order on a pipeline loaded whole on every rank (no FSDP, so no step 5); `quantize`: as `apply_before_fsdp`."""
    apply_before_fsdp(pipe, spec, ctx, config, quantize)


def shard_loaded(pipe, spec: ModelSpec, ctx: ParallelContext, config: ParallelizeConfig = ParallelizeConfig()) -> None:
    """Step 5 on a pipeline whose components are already filled on every rank (each its own tensor-parallel
    part, read from the checkpoint): each `sharded(spec)` component sharded over `ctx.fsdp_mesh`, per block
    then the root (FSDP2 shards the materialised parameters, DTensors of the tp split included)."""
    for _, module in _components(pipe, sharded(spec, config.text_encoders)):
        fsdp.shard(module, ctx.fsdp_mesh, ctx.ledger)


def shard_pipeline(skeleton, full, spec: ModelSpec, ctx: ParallelContext,
                   config: ParallelizeConfig = ParallelizeConfig()) -> None:
    """The order for `--fsdp`: steps 1-4 on `skeleton` (its `sharded(spec)` components built on the meta
    device), then step 5: each of those components sharded over `ctx.fsdp_mesh`, per block then the root,
    and filled from `full`, the whole pipeline the group leader loaded on the CPU (None on other ranks)."""
    leader = ctx.group.rank == 0
    apply_before_fsdp(skeleton, spec, ctx, config)
    # 5. FSDP per block, then the root
    for name, module in _components(skeleton, sharded(spec, config.text_encoders)):
        fsdp.shard(module, ctx.fsdp_mesh, ctx.ledger)
        state = fsdp.full_state(getattr(full, name)) if leader else None
        fsdp.load_shards(module, state, ctx.group, ctx.fsdp_mesh, ctx.device, ctx.tp_comm, staged=ctx.dims.pp > 1)
