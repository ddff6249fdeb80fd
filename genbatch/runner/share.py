"""The jobs a run's ranks share: the manifest read and checked on rank 0, what is pending handed to every rank.

    manifest = read_manifest(options, world)     rank 0: the valid rows' jobs, the rejected rows; UsageError
    share = pending_share(options, world, store, manifest, batch_size)
    share.jobs, share.batches                     every rank: the pending jobs of this run's share, in hand-out
                                                  order, cut into batches

Rank 0 reads the manifest (column-wise, `genbatch.manifests`), checks every model it names against the layout
(`World.check_models`), rejects the rows no rank's memory can hold (`genbatch.runner.stale_rows`), lists the
done markers once and leaves out the done jobs and those failed in --max-attempts runs; every rank receives the
pending table as Arrow buffers (`World.shared_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from genbatch.jobs.batches import Batches, batch_positions, kept_starts
from genbatch.jobs.schedule import OrderKeys, hand_out_positions, share_positions
from genbatch.jobs.table import JobTable
from genbatch.manifests.validate import Rejection
from genbatch.models import resolve_model
from genbatch.runner.options import RunOptions, UsageError

if TYPE_CHECKING:
    from genbatch.io import RunStore
    from genbatch.runner.world import World


@dataclass(kw_only=True, slots=True)
class ManifestRows:
    """The manifest as rank 0 read it (the other ranks hold an empty one)."""

    jobs: JobTable
    """The valid rows' jobs, in manifest order."""
    rejected: list[Rejection] = field(default_factory=list)
    """One entry per problem of each rejected row (validation's, and the rows no rank can hold)."""
    extra_columns: list[str] = field(default_factory=list)
    """The manifest's extra columns, in file order."""


def read_manifest(options: RunOptions, world: World) -> ManifestRows:
    """The manifest's jobs and rejected rows on rank 0 (an empty `ManifestRows` on the others); UsageError on
    every rank for a manifest that cannot be read or a layout a model cannot take."""
    import torch

    from genbatch.manifests import ManifestFileError, read_jobs
    from genbatch.runner.decode import device_memory_bytes
    from genbatch.runner.stale_rows import reject_unfit

    loaded = None

    def read() -> str | None:
        nonlocal loaded
        try:
            result = read_jobs(options.manifest, overrides=options.model.row_defaults(),
                               storage_options=dict(options.storage.options), media_policy=options.media_policy())
            world.check_models(result.jobs.models())
            patches = world.stale.patches if world.stale is not None else None
            result.jobs, unfit = reject_unfit(result.jobs, world.ctx.dims, device_memory_bytes(world.ctx.device),
                                              torch.finfo(world.dtype).bits // 8, patches)
            result.rejected.extend(unfit)
            loaded = result
            return None
        except (ManifestFileError, UsageError, FileNotFoundError) as error:
            return str(error)

    problem = world.shared_value(read)
    if problem is not None:
        raise UsageError(problem)
    if loaded is None:
        return ManifestRows(jobs=JobTable.empty())
    return ManifestRows(jobs=loaded.jobs, rejected=loaded.rejected, extra_columns=loaded.extra_columns)


@dataclass(kw_only=True, slots=True)
class PendingShare:
    """What this run's ranks run: the pending jobs of its share, and how they came to be that."""

    jobs: JobTable
    """The pending jobs in hand-out order."""
    batches: Batches
    """`jobs` cut into batches (one job each by default)."""
    selected: int
    """Jobs in the run's share, done or not."""
    given_up: dict[str, int]
    """Jobs left out for having failed in --max-attempts runs: id -> the runs they failed in."""
    done_ids: set[str] | None = None
    """Rank 0's listing of the done markers (None on the other ranks)."""


def _pending(options: RunOptions, jobs: JobTable, store: RunStore, batch_size: int
             ) -> tuple[JobTable, tuple[int, dict[str, int], np.ndarray | None], set[str]]:
    """The jobs to run (of one share: `options.resume.share`; all for None) in hand-out order: not done, and
    failed in fewer than --max-attempts run attempts; with (the jobs in the share, {job id: failed runs} of
    those left out for having failed too often, where each batch of `batch_size` starts in the jobs, None for
    batches of one), and the done ids (rank 0's alone). One listing of the done markers, whatever the number of
    jobs."""
    import pyarrow as pa
    import pyarrow.compute as pc

    share, max_attempts = options.resume.share, options.resume.max_attempts
    keys = OrderKeys(jobs, resolve_model)
    selected = np.arange(len(jobs), dtype=np.int64) if share is None else share_positions(keys, *share)
    done = store.done_ids()
    failed_runs = {job_id: runs for job_id, runs in store.failed_runs().items() if job_id not in done}
    ids = jobs.column("id")
    tried = pa.array([job_id for job_id, runs in failed_runs.items() if runs >= max_attempts], pa.string())
    selected_ids = ids if share is None else ids.take(selected)
    given_up = {job_id: failed_runs[job_id] for job_id in selected_ids.filter(pc.is_in(selected_ids, tried)).to_pylist()}
    left_out = pc.is_in(ids, value_set=pa.array([*done, *given_up], pa.string())).to_numpy(zero_copy_only=False)
    order = hand_out_positions(keys, selected)
    if batch_size == 1:
        return jobs.take(order[~left_out[order]]), (len(selected), given_up, None), done
    # batches over the whole share, done jobs left out after: a rerun runs the batches the first attempt formed
    in_batches, starts = batch_positions(jobs.take(order), batch_size)
    positions = order[in_batches]
    keep = ~left_out[positions]
    return jobs.take(positions[keep]), (len(selected), given_up, kept_starts(starts, keep)), done


def pending_share(options: RunOptions, world: World, store: RunStore, manifest: ManifestRows,
                  batch_size: int) -> PendingShare:
    """Every rank's pending jobs of this run's share, as rank 0 found them (one Arrow table, broadcast)."""
    jobs, (selected, given_up, starts), done = world.shared_table(
        lambda: _pending(options, manifest.jobs, store, batch_size))
    batches = Batches.single(jobs) if starts is None else Batches(jobs=jobs, starts=starts)
    return PendingShare(jobs=jobs, batches=batches, selected=selected, given_up=given_up, done_ids=done)
