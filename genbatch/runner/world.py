"""The processes of a run: process-group start-up from the torchrun/srun environment, the mesh, and the few
things every rank must agree on (the job list, the run id), decided by rank 0 and broadcast (the job list
as one Arrow buffer: `shared_jobs`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from genbatch.jobs import exit_codes
from genbatch.cluster.slurm_step import step_process_group_env
from genbatch.models import family, resolve_model
from genbatch.parallel.attention.local import check_kernel
from genbatch.parallel.comm import Comm
from genbatch.parallel.config import ParallelizeConfig
from genbatch.parallel.context import ParallelContext, build_context
from genbatch.parallel.stale import stale_config
from genbatch.parallel.apply import TEXT_ENCODERS
from genbatch.parallel.tensor.encoders import check_splits
from genbatch.parallel.teardown import leave_process_group
from genbatch.runner.decode import mode_problem
from genbatch.runner.loading import (
    DTYPES,
    PipelineCache,
    default_dtype,
    load_pipeline,
    load_sharded_pipeline,
    load_tensor_parallel_pipeline,
)
from genbatch.runner.presets import PRESETS
from genbatch.runner.decode import device_memory_bytes
from genbatch.runner.stale_rows import reject_unfit


class UsageError(ValueError):
    """Options that cannot run (a bad layout, an unreadable manifest): exit status 2, nothing runs."""


def _return_freed_memory() -> None:
    """Give the memory Arrow's pool and the C heap hold but no longer use back to the system (glibc's
    malloc_trim; a no-op where there is none), so that start-up's peak does not add to the run's."""
    import ctypes

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _waiting(stop, what: str):
    """`stop.waiting(what)`, or nothing for a caller that installed no StopRequest."""
    return stop.waiting(what) if stop is not None else contextlib.nullcontext()


def _device() -> torch.device:
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


@dataclass(kw_only=True, slots=True)
class World:
    ctx: ParallelContext
    dtype: torch.dtype
    owns_process_group: bool
    """True when this run started the process group (and so destroys it at the end)."""
    stop: object = None
    """The run's StopRequest: a signal while the ranks wait for rank 0's shared values ends the process."""
    parallelize: ParallelizeConfig = ParallelizeConfig()
    """What the parallelisation order applies to each pipeline: compile, attention kernel, text encoders' mode
    and the default step cache (`genbatch.parallel.config`)."""
    vae_decode: str = "auto"
    """`--vae-decode`: how each job's VAE decodes (`genbatch.runner.decode`), checked against every model at
    start-up."""
    stale: object = None
    """The run's `genbatch.parallel.stale.StaleConfig` (None: exact attention)."""

    @property
    def world_size(self) -> int:
        return self.ctx.dims.world_size

    def shared_value(self, compute):
        """`compute()` on rank 0, the same value on every rank; a StorageError it raises is raised on every rank
        (so that all of them stop with the same status, none left waiting for rank 0)."""
        if not self.ctx.distributed:
            return compute()
        with _waiting(self.stop, "a start-up broadcast"):
            return self._shared_value(compute)

    def _shared_value(self, compute):
        from genbatch.io.retry import StorageError

        value = None
        if self.ctx.rank == 0:
            try:
                value = compute()
            except StorageError as error:
                value = error
        value = self._everyone().broadcast_object(value)
        if isinstance(value, StorageError):
            raise value
        return value

    def _everyone(self) -> Comm:
        """Every rank of the run, counted into the run's ledger (start-up's broadcasts go through it)."""
        return Comm(dist.group.WORLD, self.ctx.ledger)

    def load_manifest(self, options):
        """(jobs, rejected, extra_columns) on rank 0, with `jobs` a `JobTable`, and (None, [], []) on the other
        ranks (the jobs they run reach them with `shared_jobs`); or, on every rank, the exit status of a usage
        error."""
        from genbatch.manifests import ManifestFileError, read_jobs

        loaded = None

        def read():
            nonlocal loaded
            try:
                loaded = read_jobs(options.manifest, overrides=options.row_defaults(),
                                   storage_options=options.storage_options, media_policy=options.media_policy())
                self._validate_layout(loaded.jobs.models())
                patches = self.stale.patches if self.stale is not None else None
                loaded.jobs, unfit = reject_unfit(loaded.jobs, self.ctx.dims, device_memory_bytes(self.ctx.device),
                                                  torch.finfo(self.dtype).bits // 8, patches)
                loaded.rejected.extend(unfit)
                return None
            except (ManifestFileError, UsageError, FileNotFoundError) as error:
                return f"genbatch: {error}"

        problem = self.shared_value(read)
        if problem is not None:
            if self.ctx.rank == 0:
                print(problem, file=sys.stderr)
            return exit_codes.USAGE
        if loaded is None:
            return None, [], []
        return loaded.jobs, loaded.rejected, loaded.extra_columns

    def shared_jobs(self, compute):
        """`compute()` on rank 0 gives (a `JobTable`, a small value); every rank gets the same two. The table
        travels as Arrow IPC pieces and its order as one int64 tensor, read in place: never a pickled list of
        jobs, and never a second whole copy on rank 0. A StorageError of `compute` is raised on every rank."""
        if not self.ctx.distributed:
            jobs, value = compute()
            _return_freed_memory()
            return jobs, value
        import warnings

        from genbatch.jobs.table import JobTable

        kept = {}

        def header():
            jobs, value = compute()
            if len(jobs) < jobs.table.num_rows // 2:  # most are done or in other shares: send only these
                jobs = JobTable(jobs.table.take(jobs.order))
            kept["jobs"] = jobs
            return jobs.ipc_pieces(), len(jobs), value

        pieces, count, value = self.shared_value(header)
        source = self.ctx.rank == 0
        order = torch.from_numpy(kept["jobs"].order) if source else torch.empty(count, dtype=torch.int64)
        self._broadcast(order)
        received = []
        for index in range(pieces):
            payload = kept["jobs"].ipc_piece(index) if source else None
            size = torch.tensor([payload.size if source else 0], dtype=torch.int64)
            self._broadcast(size)
            if source:
                with warnings.catch_warnings():  # read-only Arrow memory: the source only reads it
                    warnings.simplefilter("ignore", UserWarning)
                    data = torch.frombuffer(payload, dtype=torch.uint8)
            else:
                data = torch.empty(int(size.item()), dtype=torch.uint8)
            self._broadcast(data)
            if not source:
                received.append(data.numpy())
        jobs = kept.pop("jobs") if source else JobTable.from_ipc(received, order.numpy())
        _return_freed_memory()  # what reading, checking and ordering freed, before the model loads
        return jobs, value

    def _broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every rank's (CPU tensors; nccl broadcasts through device memory)."""
        if self.ctx.device.type == "cpu":
            self._everyone().broadcast(tensor)
            return
        moved = tensor.to(self.ctx.device)
        self._everyone().broadcast(moved)
        if self.ctx.rank != 0:
            tensor.copy_(moved.cpu())

    def _validate_layout(self, models: list[str]) -> None:
        for name in models:
            spec = resolve_model(name)
            try:
                self.ctx.dims.validate(world_size=self.world_size, num_heads=spec.num_heads, uses_cfg=spec.uses_cfg)
            except ValueError as error:
                raise UsageError(f"layout {self.ctx.dims.describe()} does not fit model {name}: {error}") from None
            try:
                check_kernel(self.parallelize.attention, self.ctx.device, self.dtype, spec.head_dim,
                             masked=family(spec.family).masks_attention())
            except ValueError as error:
                raise UsageError(f"model {name}: {error}") from None
            problem = mode_problem(self.vae_decode, spec)
            if problem is not None:
                raise UsageError(f"model {name}: {problem}")
            try:
                check_splits(spec.path, TEXT_ENCODERS, self.parallelize.text_encoders, self.ctx.group.size,
                             fsdp=self.ctx.dims.fsdp)
            except ValueError as error:
                raise UsageError(f"model {name}: {error}") from None

    def executor(self, options, store, writer, run_id: str, stop=None):
        """The job executor of this rank; `stop` is the run's installed StopRequest (a new one if None)."""
        from genbatch.io.media_input import MediaReader
        from genbatch.runner.adapters import Adapters
        from genbatch.io.retry import RetryPolicy
        from genbatch.parallel.cfg import branch_exchange
        from genbatch.runner.decode import Decoder
        from genbatch.runner.embeddings import EmbeddingCache
        from genbatch.runner.execute import JobExecutor
        from genbatch.runner.signals import StopRequest

        policy = options.media_policy()  # what rows' images and adapters may read
        return JobExecutor(
            ctx=self.ctx,
            pipelines=PipelineCache(load=self.load_pipeline),
            store=store,
            writer=writer,
            exchange=branch_exchange(self.ctx),
            decoder=Decoder(ctx=self.ctx, mode=options.vae_decode,
                            memory_bytes=None if options.vae_memory_gib is None else int(options.vae_memory_gib * 2**30)),
            stop=stop if stop is not None else StopRequest().install(),
            checkpoints=options.checkpoints,
            run_id=run_id,
            stale=self.stale,
            media=MediaReader(storage_options=dict(options.storage_options),
                              retry=RetryPolicy(timeout_s=options.storage_timeout), policy=policy),
            adapters=Adapters(policy=policy, storage_options=dict(options.storage_options),
                              timeout_s=options.storage_timeout),
            embeddings=EmbeddingCache(max_bytes=int(options.embedding_cache_gib * 2**30)),
        )

    def load_pipeline(self, spec):
        """Load `spec` and parallelise it for this rank's job group."""
        from genbatch.parallel.apply import parallelize_pipeline

        if spec.name not in PRESETS and (self.ctx.dims.tp > 1 or self._reads_encoder_parts(spec)):
            # a directory: each rank reads its own shards of what tensor parallelism splits
            return load_tensor_parallel_pipeline(spec, self.ctx, self.dtype, self.parallelize)
        if self.ctx.dims.fsdp and self.ctx.group.size > 1:
            return load_sharded_pipeline(spec, self.ctx, self.dtype, self.parallelize)
        pipe = load_pipeline(spec, self.ctx.device, self.dtype)
        parallelize_pipeline(pipe, spec, self.ctx, self.parallelize)
        return pipe

    def _reads_encoder_parts(self, spec) -> bool:
        """True when some text encoder of `spec`'s directory is split over the job group without `--tp` (and
        without `--fsdp`, whose group leader reads the model), read from its saved config: each rank then reads
        only its part of it."""
        from genbatch.parallel.tensor.encoders import config_width, mode_for

        dims = self.ctx.dims
        if self.ctx.group.size == 1 or dims.fsdp:
            return False
        widths = [config_width(spec.path, name) for name in TEXT_ENCODERS]  # 0: no such encoder (or no config)
        return any(width and mode_for(self.parallelize.text_encoders, width, fsdp=False) == "tp" for width in widths)

    def wait_for_all_ranks(self, run_id: str, store: dist.Store) -> None:
        """Rank 0 waits (without a collective, whose timeout is short) until every rank has finished."""
        if not self.ctx.distributed:
            return
        key = f"genbatch/{run_id}/ranks_finished"
        store.add(key, 1)
        if self.ctx.rank == 0:
            while store.add(key, 0) < self.world_size:
                time.sleep(0.2)

    def close(self) -> None:
        if self.owns_process_group:
            leave_process_group()


def start_world(options, stop=None) -> World:
    """Join the process group described by the environment (torchrun, srun) and build the mesh; `stop` (the
    run's StopRequest) ends the process on a signal during the rendezvous."""
    try:
        os.environ.update(step_process_group_env())  # srun's tasks as ranks when no torchrun started them
    except ValueError as error:
        raise UsageError(str(error)) from None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = _device()
    owns = False
    if world_size > 1 and not dist.is_initialized():
        backend = options.backend or ("nccl" if device.type == "cuda" else "gloo")
        with _waiting(stop, "the rendezvous"):
            dist.init_process_group(backend, timeout=timedelta(seconds=options.collective_timeout))
        owns = True
    elif dist.is_initialized():
        world_size = dist.get_world_size()
    try:
        parallelize = options.parallelize_config()
        cache = parallelize.caches_steps
        # however the layout is chosen, the axis table's rules (parallel/axes.py) judge it: `resolve` applies
        # them to the flags, and the planner's choice is checked here
        if options.layout == "auto":
            from genbatch.runner.auto_layout import auto_dims

            overrides = options.overrides
            dims = auto_dims(options.model, world_size, device, profile=options.profile, decode=options.vae_decode,
                             cache=cache, steps=overrides.num_inference_steps, guidance=overrides.guidance_scale)
            dims.check(cache=cache)
        else:
            dims = options.layout.resolve(world_size, cache=cache)
        stale = stale_config(dims.distrifusion, options.warmup_steps, dims.pp, options.patches)
        if dims.world_size != world_size:
            raise ValueError(
                f"{dims.describe()} = {dims.world_size} ranks, but {world_size} processes were started; leave --dp "
                "out to let it take the rest"
            )
    except ValueError as error:
        if owns:
            leave_process_group()
        raise UsageError(str(error)) from None
    dtype = DTYPES[options.dtype or default_dtype(device)]
    return World(ctx=build_context(dims, device), dtype=dtype, owns_process_group=owns, stop=stop,
                 parallelize=parallelize,
                 vae_decode=options.vae_decode, stale=stale)
