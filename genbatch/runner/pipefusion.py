"""PipeFusion's asynchronous steps: one forward per patch on every stage, the last stage stepping each patch
as it comes out and sending its part of the latent back to the first stage, which takes it in just before it
runs that patch of the next step. The pipeline is not drained between steps: the first stage starts a step's
first patch right after its last patch of the step before, while the later stages still work on that step.

    for patch i:   stage 0: take in patch i's latent of this step (sent by the last stage in the step before)
                   every stage: the forward of patch i for each of its branches (the stage link sends the
                   activations on; the text stream with patch 0 only)
                   last stage: CFG exchange, combine, step patch i with its own scheduler, send its part to stage 0

The step boundary (timing, the stop check, checkpoints) comes on each rank after its last patch of the step;
the last stage holds the whole latent there and writes the checkpoints (`ParallelContext.latent_holder`). A
job that ends or stops takes in what is still in flight, so no send is left unmatched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from genbatch.models.hooks import Conditioning, Family, Trajectory
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.pipeline.session import PipeSession
from genbatch.runner.checkpoint import restore_scheduler, scheduler_state


def _latent_part(latents: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return latents[mask.expand_as(latents)].contiguous()  # the patch's values, flat


def _receive_part(session: PipeSession, latents: torch.Tensor, patch: int) -> torch.Tensor:
    comm, mask = session.comm, session.patch_schedulers.masks[patch].expand_as(latents)
    part = latents.new_empty(int(mask.sum()))
    dist.recv(part, src=comm.global_rank(comm.size - 1), group=comm.group)
    latents = latents.clone()
    latents[mask] = part
    return latents


def patch_step(family: Family, pipe, trajectory: Trajectory, conditioning: Conditioning, exchange: BranchExchange,
               session: PipeSession, latents: torch.Tensor, index: int) -> torch.Tensor:
    """One asynchronous step on this rank; returns its latent (whole on the last stage)."""
    comm = session.comm
    first, last = comm.rank == 0, comm.rank == comm.size - 1
    final = index == len(trajectory.timesteps) - 1
    t = trajectory.timesteps[index]
    names = list(conditioning.branches)
    local = exchange.local_branches(names)
    schedulers = session.schedulers(pipe.scheduler, latents)
    for patch in range(session.config.patches):
        if first and not last and session.pending:
            latents = _receive_part(session, latents, patch)
        predictions = {}
        for name in local:
            with session.forward(name, patch):
                predictions[name] = family.predict(pipe, trajectory, latents, t, index, conditioning.branches[name])
        if not last:
            continue
        predictions = exchange.complete(predictions, names)
        noise = family.combine(predictions, conditioning.guidance_scale, t)
        latents = schedulers.step(patch, noise, t, latents)
        if not first and not final:
            part = _latent_part(latents, schedulers.masks[patch])
            comm.ledger.add("pp_latent", part.numel() * part.element_size())
            session.wait_send(patch)  # the step before's part of this patch: stage 0 took it in long ago
            session.sends[patch] = (dist.isend(part, dst=comm.global_rank(0), group=comm.group), part)
    if last:
        schedulers.merge_into(pipe.scheduler, latents)
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
    source = comm.global_rank(comm.size - 1)
    dist.broadcast(latents, src=source, group=comm.group)
    holder = [scheduler_state(pipe.scheduler) if comm.rank == comm.size - 1 else None]
    dist.broadcast_object_list(holder, src=source, group=comm.group)
    restore_scheduler(pipe.scheduler, holder[0], device)
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
    latents = latents.contiguous()
    if comm.rank == comm.size - 1:
        comm.ledger.add("pp_latent", latents.numel() * latents.element_size() * (comm.size - 1))
    dist.broadcast(latents, src=comm.global_rank(comm.size - 1), group=comm.group)
    return latents
