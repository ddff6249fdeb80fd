"""The processes of a run: process-group start-up from the torchrun/srun environment, the mesh, the few things
every rank must agree on (the run id, the pending jobs), decided by rank 0 and broadcast (the job table as Arrow
buffers: `shared_table`), the start-up check of each model against the layout, and the end barrier.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

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
from genbatch.parallel.stale import StaleConfig
from genbatch.runner.loading import DTYPES, default_dtype
from genbatch.runner.options import RunOptions, UsageError
from genbatch.runner.signals import StopRequest

__all__ = ["UsageError", "World", "start_world"]


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


def _waiting(stop: StopRequest | None, what: str):
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
    stop: StopRequest | None = None
    """The run's StopRequest: a signal while the ranks wait for rank 0's shared values ends the process."""
    parallelize: ParallelizeConfig = ParallelizeConfig()
    """What the parallelisation order applies to each pipeline: compile, attention kernel, text encoders' mode
    and the default step cache (`genbatch.parallel.config`)."""
    vae_decode: str = "auto"
    """`--vae-decode`: how each job's VAE decodes (`genbatch.runner.decode`), checked against every model at
    start-up."""
    stale: StaleConfig | None = None
    """The run's stale-K/V attention (`--distrifusion`, `--pipefusion`; None: exact attention)."""

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

    def shared_table(self, compute):
        """`compute()` on rank 0 gives (a `JobTable`, a small value, a value for rank 0 alone); every rank gets
        the same table and small value, and rank 0 its own value too (None on the others). The table travels as
        Arrow IPC pieces and its order as one int64 tensor, read in place: never a pickled list of jobs, and
        never a second whole copy on rank 0. A StorageError of `compute` is raised on every rank."""
        if not self.ctx.distributed:
            jobs, value, own = compute()
            _return_freed_memory()
            return jobs, value, own
        import warnings

        from genbatch.jobs.table import JobTable

        source = self.ctx.rank == 0
        jobs = own = None

        def header():
            nonlocal jobs, own
            jobs, value, own = compute()
            if len(jobs) < jobs.table.num_rows // 2:  # most are done or in other shares: send only these
                jobs = JobTable(jobs.table.take(jobs.order))
            return jobs.ipc_pieces(), len(jobs), value

        pieces, count, value = self.shared_value(header)
        order = torch.from_numpy(jobs.order) if source else torch.empty(count, dtype=torch.int64)
        self._broadcast(order)
        received = []
        for index in range(pieces):
            payload = jobs.ipc_piece(index) if source else None
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
        if not source:
            jobs = JobTable.from_ipc(received, order.numpy())
        _return_freed_memory()  # what reading, checking and ordering freed, before the model loads
        return jobs, value, own

    def _broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every rank's (CPU tensors; nccl broadcasts through device memory)."""
        if self.ctx.device.type == "cpu":
            self._everyone().broadcast(tensor)
            return
        moved = tensor.to(self.ctx.device)
        self._everyone().broadcast(moved)
        if self.ctx.rank != 0:
            tensor.copy_(moved.cpu())

    def check_models(self, models: list[str]) -> None:
        """Each model against the layout, the attention kernel, the decode mode and the text encoders' split;
        UsageError naming the model and the fix."""
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


def start_world(options: RunOptions, stop: StopRequest | None = None) -> World:
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
        backend = options.layout.backend or ("nccl" if device.type == "cuda" else "gloo")
        with _waiting(stop, "the rendezvous"):
            dist.init_process_group(backend, timeout=timedelta(seconds=options.layout.collective_timeout))
        owns = True
    elif dist.is_initialized():
        world_size = dist.get_world_size()
    try:
        parallelize = options.model.parallelize_config()
        cache = parallelize.caches_steps
        quantization = parallelize.quantization.kind
        layout = options.layout
        # however the layout is chosen, the axis table's rules (parallel/axes.py) judge it: `resolve` applies
        # them to the flags, and the planner's choice is checked here
        if layout.request == "auto":
            from genbatch.runner.auto_layout import auto_dims

            overrides = options.model.overrides
            dims = auto_dims(options.model.model, world_size, device, profile=layout.profile,
                             decode=layout.vae_decode, cache=cache, steps=overrides.num_inference_steps,
                             guidance=overrides.guidance_scale, quantization=parallelize.quantization)
            dims.check(cache=cache, quantization=quantization)
        else:
            dims = layout.request.resolve(world_size, cache=cache, quantization=quantization)
        stale = stale_config(dims.distrifusion, layout.warmup_steps, dims.pp, layout.patches)
        if dims.world_size != world_size:
            raise ValueError(
                f"{dims.describe()} = {dims.world_size} ranks, but {world_size} processes were started; leave --dp "
                "out to let it take the rest"
            )
    except ValueError as error:
        if owns:
            leave_process_group()
        raise UsageError(str(error)) from None
    dtype = DTYPES[options.model.dtype or default_dtype(device)]
    return World(ctx=build_context(dims, device), dtype=dtype, owns_process_group=owns, stop=stop,
                 parallelize=parallelize, vae_decode=layout.vae_decode, stale=stale)
