"""One job on one job group: encode -> denoise (checkpointed, stoppable) -> decode -> media -> commit.

Every rank of the group runs `JobExecutor.run` for the same job at the same time and issues the same
collectives in the same order. The group leader resumes from the job's checkpoint (if any), shares it with
the group, and alone encodes and writes the media and the done marker.

A job's model (spec, family, pipeline) is resolved once, when the job starts (`JobExecutor.model_for`), and
carried through its stages and checkpoints as a `JobModel`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from genbatch.io.media_input import MediaReader
from genbatch.io.sound import Soundtrack
from genbatch.io.stage_names import COMPRESS
from genbatch.jobs.batches import batch_id
from genbatch.jobs.cache import parse_cache
from genbatch.models.spec import ModelSpec
from genbatch.jobs.prepared import PreparedJob, RowFailure
from genbatch.jobs.spec import JobSpec
from genbatch import models
from genbatch.models import resolve_model
from genbatch.models.hooks import FamilyHooks, to_uint8
from genbatch.models.scheduler_state import restore_scheduler, scheduler_state
from genbatch.parallel.cache.agreement import decision_comm
from genbatch.parallel.cache.session import SKIPPED
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.context import ParallelContext
from genbatch.parallel.features import start_hooks
from genbatch.parallel.job_hooks import JobStart, RunFeatures
from genbatch.parallel.stale import EXACT, StaleConfig, label
from genbatch.parallel.vae import parallel_encoding
from genbatch.runner.adapters import Adapters
from genbatch.runner.agreement import StopAgreement
from genbatch.runner.checkpoint import CheckpointPolicy, DenoiseCheckpoint
from genbatch.runner.decode import Decoder
from genbatch.runner.embeddings import DEFAULT_GIB, EmbeddingCache, embedding_key
from genbatch.runner.denoise import denoise
from genbatch.runner.loading import PipelineCache
from genbatch.runner.prepare import PrepareContext, PreparedBatch, prepare_batch
from genbatch.runner.signals import StopRequest
from genbatch.runner.timing import JobTimer

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

    from genbatch.io import BackgroundWriter, RunStore


class JobInterrupted(Exception):
    """The run was asked to stop; the job's state was checkpointed at a step boundary."""


class NonFiniteLatents(RuntimeError):
    """The denoised latents hold NaN or inf (every rank of the group sees the same latents)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobModel:
    """A job's model, resolved once when the job starts and carried with it through every stage."""

    spec: ModelSpec
    """The model's spec."""
    family_hooks: FamilyHooks
    """Its family's denoise hooks."""
    pipe: DiffusionPipeline
    """Its pipeline, loaded and parallelised for this rank's group."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodedRow:
    """One row's decoded output on the group leader (None elsewhere): its frames, and its sound when its family
    makes one (`FamilyHooks.soundtrack`)."""

    frames: np.ndarray | None
    """[0, 1] frames, (frames, h, w, c) for a video or (h, w, c) for an image; None off the leader."""
    sound: Soundtrack | None = None
    """The row's waveform at its sample rate, written as the video's audio track."""


@dataclass(kw_only=True, slots=True)
class BatchResult:
    records: list[dict]
    """Each job that ran's result record (status done, in batch order), also stored in its done marker."""
    timings: list[dict]
    """This rank's timing rows for the batch."""
    failures: list[RowFailure] = field(default_factory=list)
    """The rows that failed alone before the batch ran (their inputs could not be prepared), as its group agreed."""


def fingerprint(job: PreparedJob, approximation: str = EXACT) -> dict:
    """The settings a checkpoint must match to be resumed (a changed row, or a run under another attention
    approximation, `genbatch.parallel.stale.label`, or another weight quantization, restarts the job): the row's
    own, and what each of its inputs adds (`genbatch.jobs.inputs`: its cache mode, its images' and adapters'
    sha256)."""
    return {
        "approximation": approximation,
        "model": job.model,
        "seed": job.seed,
        "width": job.width,
        "height": job.height,
        "num_frames": job.num_frames,
        "num_inference_steps": job.num_inference_steps,
        "guidance_scale": job.guidance_scale,
        "prompt": hashlib.sha256(f"{job.prompt}\0{job.negative_prompt}".encode()).hexdigest(),
        **job.fingerprint(),
    }


def batch_fingerprint(jobs: list[PreparedJob], approximation: str = EXACT) -> dict:
    """A batch's checkpoint fingerprint: its one job's (`fingerprint`), or each job's id and fingerprint in
    batch order (a batch formed otherwise, or with a changed row, restarts)."""
    if len(jobs) == 1:
        return fingerprint(jobs[0], approximation)
    return {"batch": [[job.id, fingerprint(job, approximation)] for job in jobs]}


@dataclass(kw_only=True, slots=True)
class JobExecutor:
    ctx: ParallelContext
    pipelines: PipelineCache
    store: RunStore
    writer: BackgroundWriter
    """Uploads finished jobs (their media overlap the next job's denoising)."""
    exchange: BranchExchange
    decoder: Decoder
    stop: StopRequest
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    run_id: str = ""
    features: RunFeatures | None = None
    """The run's settings of the per-job features (`--distrifusion`/`--pipefusion`'s stale K/V; None: exact
    attention); the ranks that agree on each step-cache decision are set here, on every rank at start-up, since
    finding them may create a process group."""
    media: MediaReader = field(default_factory=MediaReader)
    """Reads a job's input media (`image`, `last_image`) once, on the rank that runs it."""
    adapters: Adapters = field(default_factory=Adapters)
    """Prepares a job's LoRA adapters once each and switches them into its pipeline."""
    embeddings: EmbeddingCache = field(default_factory=lambda: EmbeddingCache(max_bytes=int(DEFAULT_GIB * 2**30)))
    """This rank's prompt encodes, kept while they fit (`--embedding-cache-gib`)."""
    quantization: str = "none"
    """The run's weight quantization as recorded (`genbatch.jobs.quantization.Quantization.label`): each results
    row carries it, and a checkpoint taken under another is not resumed."""

    def __post_init__(self) -> None:
        features = self.features or RunFeatures()
        if features.cache_group is None:
            features = replace(features, cache_group=decision_comm(self.ctx))
        self.features = features

    @property
    def stale(self) -> StaleConfig | None:
        """The run's stale-K/V attention (None: exact)."""
        return self.features.stale

    @property
    def approximation(self) -> str:
        """What a checkpoint's fingerprint records of the run's approximations: the attention's
        (`genbatch.parallel.stale.label`), and the weights' quantization when there is one."""
        attention = label(self.stale)
        return attention if self.quantization == "none" else f"{attention}, {self.quantization} weights"

    def _shared_checkpoint(self, jobs: list[JobSpec]) -> DenoiseCheckpoint | None:
        """The leader reads the batch's checkpoint (kept under its first job's id); the group receives the same
        bytes (or None)."""
        payload = self.store.load_checkpoint(jobs[0].id) if self.ctx.is_leader else None
        if self.ctx.group.size > 1:
            payload = self.ctx.group.broadcast_object(payload)
        if payload is None:
            return None
        checkpoint = DenoiseCheckpoint.from_bytes(payload)
        if checkpoint.fingerprint != batch_fingerprint(jobs, self.approximation):
            return None  # a row changed since the checkpoint was taken (or the batch is another): start over
        return checkpoint

    def prepare(self, jobs: list[JobSpec], model: JobModel, timer: JobTimer) -> PreparedBatch:
        """The batch's rows prepared before its first collective (images read, adapters switched in), and the
        rows that fail alone, as the whole group agreed (`genbatch.runner.prepare`)."""
        return prepare_batch(jobs, PrepareContext(model=model, group=self.ctx.group, media=self.media,
                                                  adapters=self.adapters, timer=timer))

    def model_for(self, job: JobSpec) -> JobModel:
        """Resolve the job's model: its spec, its family's hooks and its pipeline (loaded on first use)."""
        spec = resolve_model(job.model)
        return JobModel(spec=spec, family_hooks=models.family(spec.family).hooks, pipe=self.pipelines.get(spec))

    def _save_checkpoint(self, jobs: list[JobSpec], model: JobModel, steps_done: int, latents, generators) -> None:
        if not self.ctx.holds_latents:
            return
        states = [generator.get_state() for generator in generators]
        checkpoint = DenoiseCheckpoint(
            job_id=jobs[0].id,
            fingerprint=batch_fingerprint(jobs, self.approximation),
            steps_done=steps_done,
            latents=latents.detach().to("cpu", copy=True),
            scheduler=scheduler_state(model.pipe.scheduler),
            rng={"torch_cpu": torch.get_rng_state(),
                 **({"generator": states[0]} if len(states) == 1 else {"generators": states})},
        )
        self.writer.submit(self.store.save_checkpoint, jobs[0].id, checkpoint.to_bytes())

    def generate_batch(self, jobs: list[PreparedJob], timer: JobTimer, model: JobModel | None = None
                       ) -> list[DecodedRow]:
        """Encode, denoise (resuming from a checkpoint), decode a batch of prepared jobs that agree on their batch
        key (`genbatch.jobs.batches`), run in one forward per step: each row's frames and sound on the leader
        (`DecodedRow`). Raises JobInterrupted when the run is asked to stop (after checkpointing)."""
        model = model or self.model_for(jobs[0])
        return self.decode_batch(jobs, self.denoise_batch(jobs, timer, model), timer, model)

    def _conditioning(self, jobs: list[JobSpec], model: JobModel, timer: JobTimer):
        """The batch's conditioning: each row's prompt encode (once per distinct prompt while the embedding
        cache holds it; its `text_encode` row says `cache_hit`), joined by the family."""
        rows = []
        for job in jobs:
            with timer.stage("text_encode", **self._own_columns(job, jobs)) as stage:
                conditioning, hit = self.embeddings.get(
                    embedding_key(job), lambda job=job: model.family_hooks.encode(model.pipe, job, self.ctx.device))
                stage.extra["cache_hit"] = hit
            rows.append(conditioning)
        return model.family_hooks.batch_conditioning(rows)

    def denoise_batch(self, jobs: list[PreparedJob], timer: JobTimer, model: JobModel | None = None) -> torch.Tensor:
        """Encode the batch's prompts and denoise (from its checkpoint when there is one): the final latents of
        its rows, joined along dim 0 in the batch's order, identical on every rank of the group."""
        model = model or self.model_for(jobs[0])
        family_hooks, pipe = model.family_hooks, model.pipe
        device = self.ctx.device
        # each row's noise from its own seed, as diffusers draws a list of generators'
        generators = [torch.Generator("cpu").manual_seed(job.seed) for job in jobs]

        with torch.no_grad():  # not inference_mode: FSDP2's DTensors need ordinary tensors
            conditioning = self._conditioning(jobs, model, timer)
            # an image row's VAE encode (in the pipeline's own prepare_latents) is split over the job group
            with parallel_encoding(getattr(pipe, "vae", None), self.ctx.group):
                trajectory = family_hooks.batch_trajectory([family_hooks.trajectory(pipe, job, generator, device)
                                                      for job, generator in zip(jobs, generators, strict=True)])
            checkpoint = self._shared_checkpoint(jobs)
            start_step, latents = 0, None
            if checkpoint is not None:
                start_step = checkpoint.steps_done
                latents = checkpoint.latents.to(device)
                restore_scheduler(pipe.scheduler, checkpoint.scheduler, device)
                states = checkpoint.rng.get("generators") or [checkpoint.rng["generator"]]
                for generator, state in zip(generators, states, strict=True):
                    generator.set_state(state)

            self.ctx.ledger.take()  # bytes before the loop (loading, text encoding) are not the steps'
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)  # step rows report this job's denoising peak
            last_save = {"step": start_step, "time": time.monotonic()}
            agreement = StopAgreement(stop=self.stop, group=self.ctx.group, device=device, start_step=start_step,
                                      total_steps=len(trajectory.timesteps))

            def after_step(steps_done: int, current) -> bool:
                if agreement.should_stop(steps_done):  # a blocking sync only every `agreement.interval` steps
                    self._save_checkpoint(jobs, model, steps_done, current, generators)
                    return True
                if self.checkpoints.due(steps_done - last_save["step"], time.monotonic() - last_save["time"]):
                    if steps_done < len(trajectory.timesteps):
                        self._save_checkpoint(jobs, model, steps_done, current, generators)
                    last_save.update(step=steps_done, time=time.monotonic())
                return False

            # a resumed job's hooks start empty: its first step computes in full, its K/V buffers re-warm
            start = JobStart(job=jobs[0], spec=model.spec, family_hooks=family_hooks, pipe=pipe, trajectory=trajectory,
                             start_step=start_step, ctx=self.ctx, run=self.features)
            with start_hooks(start) as hooks:
                result = denoise(
                    family_hooks, pipe, trajectory, conditioning,
                    timer=timer, exchange=self.exchange, start_step=start_step, latents=latents,
                    after_step=after_step, step_extra=self._step_extra, hooks=hooks,
                )
            names = ", ".join(job.id for job in jobs)
            if result.stopped:
                raise JobInterrupted(f"job {names} stopped after step {result.steps_done}")
            if not torch.isfinite(result.latents).all():
                raise NonFiniteLatents(
                    f"the latents of job {names} hold NaN/inf after {result.steps_done} steps; "
                    "try fp32 (--dtype fp32) or a lower guidance scale"
                )
        return result.latents

    def decode_batch(self, jobs: list[PreparedJob], latents: torch.Tensor, timer: JobTimer,
                     model: JobModel | None = None) -> list[DecodedRow]:
        """Final latents -> each row's [0, 1] frames (decoded patch-parallel over the group) and sound, on the
        leader; one row at a time (as that row alone decodes: the same bytes, one row's peak)."""
        model = model or self.model_for(jobs[0])
        family_hooks, pipe = model.family_hooks, model.pipe
        rows = []
        with torch.no_grad():
            for index, job in enumerate(jobs):
                row = latents if len(jobs) == 1 else latents[index : index + 1]
                with timer.stage("vae_decode", **self._own_columns(job, jobs)):
                    decoded = self.decoder.decode(pipe, family_hooks.vae_input(pipe, job, row),
                                                  (job.width, job.height, job.num_frames))
                stage_memory = self.decoder.last_peak_bytes
                if stage_memory is not None:
                    timer.intervals[-1].extra["peak_bytes"] = stage_memory
                sound = None
                if decoded is not None and family_hooks.wants_sound(job):
                    with timer.stage("audio_decode", **self._own_columns(job, jobs)):
                        sound = family_hooks.soundtrack(pipe, job, row)
                rows.append(DecodedRow(frames=None if decoded is None else family_hooks.postprocess(pipe, decoded),
                                       sound=sound))
        return rows

    def run_batch(self, jobs: list[JobSpec]) -> BatchResult:
        """Prepare a batch (jobs that agree on their batch key), generate the rows that prepared and, on the
        leader, hand each one's media and done marker to the writer. The rows that could not be prepared fail
        alone (`BatchResult.failures`, to record)."""
        timer = JobTimer(self.ctx.device)
        model = self.model_for(jobs[0])
        prepared = self.prepare(jobs, model, timer)
        jobs = prepared.jobs
        if not jobs:
            return BatchResult(records=[], timings=timer.rows(**self._timing_columns(prepared.failures[0].job)),
                               failures=prepared.failures)
        try:
            decoded = self.generate_batch(jobs, timer, model)
        except JobInterrupted:
            self.store.append_timings(self._timing_rows(timer, jobs))
            raise
        batch = {"batch_id": batch_id([job.id for job in jobs]), "batch_size": len(jobs)}
        records = [{**job.record(), "status": "done", "run_id": self.run_id, "rank": self.ctx.rank,
                    "vae_decode": self.decoder.last_mode, "attention_approximation": label(self.stale),
                    "quantization": self.quantization, **batch,
                    **{f"{column}_sha256": media.sha256 for column, media in job.media.items()}} for job in jobs]
        if not self.ctx.is_leader:
            return BatchResult(records=records, timings=self._timing_rows(timer, jobs), failures=prepared.failures)
        encoded = []
        for job, output in zip(jobs, decoded, strict=True):
            with timer.stage(COMPRESS, **self._own_columns(job, jobs)):
                encoded.append(self._compress(to_uint8(output.frames), job, model.spec.is_video, output.sound))
        skipped = sum(interval.extra.get(SKIPPED, 0) for interval in timer.intervals)
        for job, record, (media, ext), output in zip(jobs, records, encoded, decoded, strict=True):
            record["output_uri"] = self.store.output_uri(job.id, ext)
            if output.sound is not None:
                record.update(audio_sample_rate=output.sound.sample_rate, audio_seconds=output.sound.seconds)
            seconds = timer.seconds_by_stage(job.id if len(jobs) > 1 else None)
            record.update({f"{stage}_s": value for stage, value in seconds.items()})
            if parse_cache(job.cache).enabled:  # this run's steps only (a resumed job's earlier run had its own)
                record[SKIPPED] = skipped
            record["finished_at"] = time.time()
        timings = self._timing_rows(timer, jobs)
        for job, record, (media, ext) in zip(jobs, records, encoded, strict=True):
            self.writer.submit(self._commit, job, media, ext, record)
        return BatchResult(records=records, timings=timings, failures=prepared.failures)

    @staticmethod
    def _own_columns(job: JobSpec, jobs: list[JobSpec]) -> dict:
        """The columns of a timing interval that is one row's own in a batch (its `job_id`); none for one job."""
        return {"job_id": job.id} if len(jobs) > 1 else {}

    def _timing_columns(self, job: JobSpec, batch: dict | None = None) -> dict:
        """What every timing row of the job on this rank carries: the run, job, rank and layout name (`dp2`), and
        in a batch of more than one its `batch_id` and `batch_size`."""
        return {"run_id": self.run_id, "job_id": job.id, "rank": self.ctx.rank, "layout": self.ctx.dims.name,
                **(batch or {})}

    def _timing_rows(self, timer: JobTimer, jobs: list[JobSpec]) -> list[dict]:
        """The batch's timing rows: its shared intervals under its first job's id, each row's own under its id."""
        batch = {"batch_id": batch_id([job.id for job in jobs]), "batch_size": len(jobs)} if len(jobs) > 1 else None
        return timer.rows(**self._timing_columns(jobs[0], batch))

    def _commit(self, job: JobSpec, media: bytes, ext: str, record: dict) -> None:
        """Runs on the writer thread: media, then the done marker, then the checkpoint goes away."""
        started, clock = time.time(), time.perf_counter()
        self.store.commit(job.id, media, ext, record)
        self.store.delete_checkpoint(job.id)
        self.store.append_timings([{
            **self._timing_columns(job), "stage": "write", "step": None, "start": started,
            "seconds": time.perf_counter() - clock,
        }])

    @staticmethod
    def _compress(frames: np.ndarray, job: JobSpec, is_video: bool, sound=None) -> tuple[bytes, str]:
        """The output file's bytes and extension: a PNG of an image, an H.264 MP4 (with its sound) of a video."""
        from genbatch.io import encode_mp4, encode_png

        if is_video:
            return encode_mp4(frames, fps=job.fps, sound=sound), "mp4"
        return encode_png(frames), "png"

    def _step_extra(self) -> dict:
        """Per-step columns: bytes sent by collective kind; on GPUs, the job's peak memory so far."""
        extra = {f"bytes_{kind}": count for kind, count in self.ctx.ledger.take().items()}
        if self.ctx.device.type == "cuda":
            extra["peak_bytes"] = torch.cuda.max_memory_allocated(self.ctx.device)  # a counter read, no sync
        return extra
