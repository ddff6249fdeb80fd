"""PipeFusion's asynchronous steps: one forward per patch on every stage, the last stage stepping each patch
as it comes out and sending its part of the latent back to the first stage, which takes it in just before it
runs that patch of the next step. The pipeline is not drained between steps: the first stage starts a step's
first patch right after its last patch of the step before, while the later stages still work on that step.

    for patch i:   stage 0: take in patch i's latent of this step (sent by the last stage in the step before)
                   every stage: the forward of patch i for each of its branches (the stage link sends the
                   activations on; the text stream with patch 0 only)
                   last stage: CFG exchange, combine, step patch i with its own scheduler, send its part to stage 0

The step boundary (timing, the stop check, checkpoints) comes on each rank after its last patch of the step;
the last stage holds the whole latent there and writes the checkpoints (`ParallelContext.holds_latents`). A
job that ends or stops takes in what is still in flight, so no send is left unmatched.

`PipeSession` (the feature's `JobHook`) calls these: `patch_step` from its `run_step`, `resync` from its
`begin_step`, `finish` from its `end`. Every transfer goes through the pp group's `Comm`, counted as `pp_latent`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from genbatch.parallel.job_hooks import DenoiseSteps
from genbatch.models.scheduler_state import restore_scheduler, scheduler_state

if TYPE_CHECKING:
    from genbatch.parallel.pipeline.session import PipeSession


def _latent_part(latents: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return latents[mask.expand_as(latents)].contiguous()  # the patch's values, flat


def _receive_part(session: PipeSession, latents: torch.Tensor, patch: int) -> torch.Tensor:
    comm, mask = session.comm, session.patch_schedulers.masks[patch].expand_as(latents)
    part = comm.recv(latents.new_empty(int(mask.sum())), comm.size - 1)
    latents = latents.clone()
    latents[mask] = part
    return latents


def patch_step(steps: DenoiseSteps, session: PipeSession, latents: torch.Tensor, index: int) -> torch.Tensor:
    """One asynchronous step on this rank; returns its latent (whole on the last stage)."""
    comm = session.comm
    first, last = comm.rank == 0, comm.rank == comm.size - 1
    final = index == len(steps.trajectory.timesteps) - 1
    t = steps.trajectory.timesteps[index]
    local = steps.exchange.local_branches(steps.branches)
    schedulers = session.schedulers(steps.pipe.scheduler, latents)
    for patch in range(session.config.patches):
        if first and not last and session.pending:
            latents = _receive_part(session, latents, patch)
        predictions = {name: steps.predict(latents, index, name, patch) for name in local}
        if not last:
            continue
        latents = schedulers.step(patch, steps.combine(predictions, index, latents), t, latents)
        if not first and not final:
            part = _latent_part(latents, schedulers.masks[patch])
            session.wait_send(patch)  # the step before's part of this patch: stage 0 took it in long ago
            session.sends[patch] = (comm.send(part, 0, kind="pp_latent"), part)
    if last:
        schedulers.merge_into(steps.pipe.scheduler, latents)
    session.pending = not final and comm.size > 1
    return latents


def _drain(session: PipeSession, latents: torch.Tensor) -> torch.Tensor:
    """Stage 0 takes in the parts the last stage sent in the step before (none are left in flight)."""
    if session.comm.rank == 0 and session.pending:
        for patch in range(session.config.patches):
            latents = _receive_part(session, latents, patch)
    session.pending = False
    return latents


def resync(session: PipeSession, pipe, latents: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Before a synchronous step that follows asynchronous ones: every stage gets the last stage's whole latent
    and scheduler state, as after a synchronous step."""
    comm = session.comm
    if session.patch_schedulers is None or comm.size == 1:
        return latents
    latents = _drain(session, latents).contiguous()
    last = comm.size - 1
    comm.broadcast(latents, last, kind="pp_latent")
    state = comm.broadcast_object(scheduler_state(pipe.scheduler) if comm.rank == last else None, last)
    restore_scheduler(pipe.scheduler, state, device)
    session.patch_schedulers = None  # the next asynchronous step copies the scheduler again
    return latents


def finish(session: PipeSession, latents: torch.Tensor, stopped: bool) -> torch.Tensor:
    """After the job's last step run on this rank: take in the parts still in flight (a stop), or give every
    stage the last stage's whole latent (the end)."""
    comm = session.comm
    if session.patch_schedulers is None or comm.size == 1:
        return latents
    if stopped:
        return _drain(session, latents)
    return comm.broadcast(latents.contiguous(), comm.size - 1, kind="pp_latent")
