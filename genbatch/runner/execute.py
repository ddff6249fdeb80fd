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

import numpy as np
import torch

from genbatch.io.media_input import MediaReader
from genbatch.jobs.batches import batch_id
from genbatch.jobs.cache import parse_cache
from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobSpec
from genbatch import models
from genbatch.models import resolve_model
from genbatch.models.hooks import Family, to_uint8
from genbatch.models.scheduler_state import restore_scheduler, scheduler_state
from genbatch.parallel.cache.agreement import decision_comm
from genbatch.parallel.cache.session import SKIPPED
from genbatch.parallel.cfg import BranchExchange
from genbatch.parallel.comm import Comm
from genbatch.parallel.context import ParallelContext
from genbatch.parallel.features import start_hooks
from genbatch.parallel.job_hooks import JobStart, RunFeatures
from genbatch.parallel.stale import EXACT, StaleConfig, label
from genbatch.parallel.vae import parallel_encoding
from genbatch.parallel.patch.session import STALE_BYTES
from genbatch.runner.adapters import Adapters
from genbatch.runner.agreement import StopAgreement
from genbatch.runner.checkpoint import DenoiseCheckpoint
from genbatch.runner.decode import Decoder
from genbatch.runner.embeddings import DEFAULT_GIB, EmbeddingCache, embedding_key
from genbatch.runner.denoise import denoise
from genbatch.runner.loading import PipelineCache
from genbatch.runner.signals import StopRequest
from genbatch.runner.timing import JobTimer


class JobInterrupted(Exception):
    """The run was asked to stop; the job's state was checkpointed at a step boundary."""


class NonFiniteLatents(RuntimeError):
    """The denoised latents hold NaN or inf (every rank of the group sees the same latents)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPolicy:
    """When a running job saves its denoising state: every `every_steps` steps, but not more often than
    every `every_seconds` seconds (a cap on checkpoint I/O when steps are fast). A stop signal always
    checkpoints, whatever the policy."""

    every_steps: int = 10
    """Steps between checkpoints (0: no periodic checkpoints)."""
    every_seconds: float = 0.0
    """The least time between two checkpoints of a job, counted from its start (0: no cap)."""

    def due(self, steps_since: int, seconds_since: float) -> bool:
        return self.every_steps > 0 and steps_since >= self.every_steps and seconds_since >= self.every_seconds


@dataclass(frozen=True, kw_only=True, slots=True)
class JobModel:
    """A job's model, resolved once when the job starts and carried with it through every stage."""

    spec: ModelSpec
    """The model's spec."""
    family: Family
    """Its family's denoise hooks."""
    pipe: object
    """Its pipeline, loaded and parallelised for this rank's group."""


@dataclass(kw_only=True, slots=True)
class BatchResult:
    records: list[dict]
    """Each job's result record (status done, in batch order), also stored in its done marker."""
    timings: list[dict]
    """This rank's timing rows for the batch."""


@dataclass(kw_only=True, slots=True)
class JobResult:
    record: dict
    """The job's result record (status done), also stored in its done marker."""
    timings: list[dict]
    """This rank's timing rows for the job."""


def fingerprint(job: JobSpec, approximation: str = EXACT) -> dict:
    """The settings a checkpoint must match to be resumed (a changed row, or a run under another attention
    approximation, `genbatch.parallel.stale.label`, restarts the job)."""
    return {
        "approximation": approximation,
        "model": job.model,
        "seed": job.seed,
        "width": job.width,
        "height": job.height,
        "num_frames": job.num_frames,
        "num_inference_steps": job.num_inference_steps,
        "guidance_scale": job.guidance_scale,
        "cache": job.cache,  # the cached state is not checkpointed, but a resumed job keeps its mode
        "prompt": hashlib.sha256(f"{job.prompt}\0{job.negative_prompt}".encode()).hexdigest(),
        # a changed input image restarts the job (a text-only job's fingerprint has no such key)
        **({"media": {column: media.sha256 for column, media in sorted(job.media.items())}} if job.media else {}),
        # so does a changed adapter, or another scale
        **({"lora": [[ref.uri, ref.weight_name, ref.scale, digest, *([ref.expert] if ref.expert else [])]
                     for ref, digest in zip(job.lora, job.lora_sha256, strict=True)]} if job.lora else {}),
    }


def batch_fingerprint(jobs: list[JobSpec], approximation: str = EXACT) -> dict:
    """A batch's checkpoint fingerprint: its one job's (`fingerprint`), or each job's id and fingerprint in
    batch order (a batch formed otherwise, or with a changed row, restarts)."""
    if len(jobs) == 1:
        return fingerprint(jobs[0], approximation)
    return {"batch": [[job.id, fingerprint(job, approximation)] for job in jobs]}


@dataclass(kw_only=True, slots=True)
class JobExecutor:
    ctx: ParallelContext
    pipelines: PipelineCache
    store: object
    """The run's `genbatch.io.RunStore`."""
    writer: object
    """The run's `genbatch.io.BackgroundWriter` (uploads overlap the next job's denoising)."""
    exchange: BranchExchange
    decoder: Decoder
    stop: StopRequest
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    run_id: str = ""
    cache_group: Comm | None = None
    """The ranks that agree on each step-cache decision (None: `decision_comm(ctx)`, built here, on every rank
    at start-up, since it may create a process group)."""
    last_summary: dict = field(default_factory=dict)
    """What the hooks of the last job this rank denoised measured (`JobHooks.summary`: the step cache's
    `cache_indicators`, the stale K/V's `stale_peak_bytes`)."""
    stale: StaleConfig | None = None
    """The run's stale-K/V attention (`--distrifusion`; None: exact)."""
    resync_steps: frozenset[int] = frozenset()
    """Steps that run synchronously under `stale` besides each job's warm-up (the uninterrupted reference of a
    resumed job, whose resume re-warmed at these steps)."""
    media: MediaReader = field(default_factory=MediaReader)
    """Reads a job's input media (`image`, `last_image`) once, on the rank that runs it."""
    adapters: Adapters = field(default_factory=Adapters)
    """Prepares a job's LoRA adapters once each and switches them into its pipeline."""
    embeddings: EmbeddingCache = field(default_factory=lambda: EmbeddingCache(max_bytes=int(DEFAULT_GIB * 2**30)))
    """This rank's prompt encodes, kept while they fit (`--embedding-cache-gib`)."""
    last_sounds: list = field(default_factory=list)
    """The sound (`genbatch.io.sound.Soundtrack`, or None) of each row of the batch last decoded here, in batch
    order: the family's `soundtrack`, made on the leader only."""

    def __post_init__(self) -> None:
        if self.cache_group is None:
            self.cache_group = decision_comm(self.ctx)

    @property
    def last_stale_bytes(self) -> int:
        """The most stale K/V bytes this rank's buffers held at once in the last job it denoised."""
        return self.last_summary.get(STALE_BYTES, 0)

    @property
    def features(self) -> RunFeatures:
        """The run's settings of the per-job features."""
        return RunFeatures(stale=self.stale, resync_steps=self.resync_steps, cache_group=self.cache_group)

    def _shared_checkpoint(self, jobs: list[JobSpec]) -> DenoiseCheckpoint | None:
        """The leader reads the batch's checkpoint (kept under its first job's id); the group receives the same
        bytes (or None)."""
        payload = self.store.load_checkpoint(jobs[0].id) if self.ctx.is_leader else None
        if self.ctx.group.size > 1:
            payload = self.ctx.group.broadcast_object(payload)
        if payload is None:
            return None
        checkpoint = DenoiseCheckpoint.from_bytes(payload)
        if checkpoint.fingerprint != batch_fingerprint(jobs, label(self.stale)):
            return None  # a row changed since the checkpoint was taken (or the batch is another): start over
        return checkpoint

    def with_media(self, job: JobSpec) -> JobSpec:
        """`job` with its input media read (`JobSpec.media`); MediaError naming the column, URL and reason."""
        if job.media:
            return job
        named = {column: getattr(job, column) for column in MEDIA_COLUMNS if getattr(job, column) is not None}
        if not named:
            return job
        return replace(job, media={column: self.media.read(column, url) for column, url in named.items()})

    def with_adapters(self, job: JobSpec, model: JobModel, timer: JobTimer) -> JobSpec:
        """Switch the pipeline's weights to the job's adapters (the base weights for none; timed as
        `lora_switch` when they change); `job` with each adapter's sha256. LoraError naming the adapter."""
        if job.lora_sha256 or (not job.lora and not self.adapters.merged(model.pipe)):
            return job  # applied already (`run` before `denoise`), or nothing to switch
        switch = self.adapters.plan(job, model.spec, model.pipe, self.ctx.group)
        if switch.needed:
            with timer.stage("lora_switch"):
                switch.apply()
        return replace(job, lora_sha256=switch.sha256)

    def _prepared(self, jobs: list[JobSpec], model: JobModel, timer: JobTimer) -> list[JobSpec]:
        """The batch's jobs with their media read and their adapters (one set: a batch agrees on it) applied."""
        jobs = [self.with_media(job) for job in jobs]
        first = self.with_adapters(jobs[0], model, timer)
        return [first, *(replace(job, lora_sha256=first.lora_sha256) for job in jobs[1:])]

    def model_for(self, job: JobSpec) -> JobModel:
        """Resolve the job's model: its spec, its family's hooks and its pipeline (loaded on first use)."""
        spec = resolve_model(job.model)
        return JobModel(spec=spec, family=models.family(spec.family).hooks, pipe=self.pipelines.get(spec))

    def _save_checkpoint(self, jobs: list[JobSpec], model: JobModel, steps_done: int, latents, generators) -> None:
        if not self.ctx.holds_latents:
            return
        states = [generator.get_state() for generator in generators]
        checkpoint = DenoiseCheckpoint(
            job_id=jobs[0].id,
            fingerprint=batch_fingerprint(jobs, label(self.stale)),
            steps_done=steps_done,
            latents=latents.detach().to("cpu", copy=True),
            scheduler=scheduler_state(model.pipe.scheduler),
            rng={"torch_cpu": torch.get_rng_state(),
                 **({"generator": states[0]} if len(states) == 1 else {"generators": states})},
        )
        self.writer.submit(self.store.save_checkpoint, jobs[0].id, checkpoint.to_bytes())

    def generate(self, job: JobSpec, timer: JobTimer, model: JobModel | None = None) -> np.ndarray | None:
        """Encode, denoise (resuming from a checkpoint), decode: [0, 1] frames on the leader, None elsewhere.
        `model`: the job's resolved model (None: resolved here).

        Raises JobInterrupted when the run is asked to stop (after checkpointing the job)."""
        return self.generate_batch([job], timer, model)[0]

    def generate_batch(self, jobs: list[JobSpec], timer: JobTimer, model: JobModel | None = None
                       ) -> list[np.ndarray | None]:
        """`generate` for a batch of jobs that agree on their batch key (`genbatch.jobs.batches`), run in one
        forward per step: each row's frames (None on the ranks that are not the leader)."""
        model = model or self.model_for(jobs[0])
        jobs = self._prepared(jobs, model, timer)
        return self.decode_batch(jobs, self.denoise_batch(jobs, timer, model), timer, model)

    def denoise(self, job: JobSpec, timer: JobTimer, model: JobModel | None = None) -> torch.Tensor:
        """Encode the prompt and denoise (from the job's checkpoint when there is one): the final latents,
        identical on every rank of the group. `model`: the job's resolved model (None: resolved here)."""
        return self.denoise_batch([job], timer, model)

    def _conditioning(self, jobs: list[JobSpec], model: JobModel, timer: JobTimer):
        """The batch's conditioning: each row's prompt encode (once per distinct prompt while the embedding
        cache holds it; its `text_encode` row says `cache_hit`), joined by the family."""
        rows = []
        for job in jobs:
            with timer.stage("text_encode", **self._own_columns(job, jobs)) as stage:
                conditioning, hit = self.embeddings.get(
                    embedding_key(job), lambda job=job: model.family.encode(model.pipe, job, self.ctx.device))
                stage.extra["cache_hit"] = hit
            rows.append(conditioning)
        return model.family.batch_conditioning(rows)

    def denoise_batch(self, jobs: list[JobSpec], timer: JobTimer, model: JobModel | None = None) -> torch.Tensor:
        """`denoise` for a batch: the final latents of its rows, joined along dim 0 in the batch's order."""
        model = model or self.model_for(jobs[0])
        jobs = self._prepared(jobs, model, timer)
        family, pipe = model.family, model.pipe
        device = self.ctx.device
        # each row's noise from its own seed, as diffusers draws a list of generators'
        generators = [torch.Generator("cpu").manual_seed(job.seed) for job in jobs]

        with torch.no_grad():  # not inference_mode: FSDP2's DTensors need ordinary tensors
            conditioning = self._conditioning(jobs, model, timer)
            # an image row's VAE encode (in the pipeline's own prepare_latents) is split over the job group
            with parallel_encoding(getattr(pipe, "vae", None), self.ctx.group):
                trajectory = family.batch_trajectory([family.trajectory(pipe, job, generator, device)
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
            start = JobStart(job=jobs[0], spec=model.spec, family=family, pipe=pipe, trajectory=trajectory,
                             start_step=start_step, ctx=self.ctx, run=self.features)
            with start_hooks(start) as hooks:
                try:
                    result = denoise(
                        family, pipe, trajectory, conditioning,
                        timer=timer, exchange=self.exchange, start_step=start_step, latents=latents,
                        after_step=after_step, step_extra=self._step_extra, hooks=hooks,
                    )
                finally:
                    self.last_summary = hooks.summary()
            names = ", ".join(job.id for job in jobs)
            if result.stopped:
                raise JobInterrupted(f"job {names} stopped after step {result.steps_done}")
            if not torch.isfinite(result.latents).all():
                raise NonFiniteLatents(
                    f"the latents of job {names} hold NaN/inf after {result.steps_done} steps; "
                    "try fp32 (--dtype fp32) or a lower guidance scale"
                )
        return result.latents

    def decode(self, job: JobSpec, latents: torch.Tensor, timer: JobTimer, model: JobModel | None = None
               ) -> np.ndarray | None:
        """Final latents -> [0, 1] frames on the leader (decoded patch-parallel over the group), None elsewhere.
        `model`: the job's resolved model (None: resolved here)."""
        return self.decode_batch([job], latents, timer, model)[0]

    def decode_batch(self, jobs: list[JobSpec], latents: torch.Tensor, timer: JobTimer,
                     model: JobModel | None = None) -> list[np.ndarray | None]:
        """`decode` for a batch, one row at a time (as that row alone decodes: the same bytes, one row's peak)."""
        model = model or self.model_for(jobs[0])
        family, pipe = model.family, model.pipe
        frames, self.last_sounds = [], []
        with torch.no_grad():
            for index, job in enumerate(jobs):
                row = latents if len(jobs) == 1 else latents[index : index + 1]
                with timer.stage("vae_decode", **self._own_columns(job, jobs)):
                    decoded = self.decoder.decode(pipe, family.vae_input(pipe, job, row),
                                                  (job.width, job.height, job.num_frames))
                stage_memory = self.decoder.last_peak_bytes
                if stage_memory is not None:
                    timer.intervals[-1].extra["peak_bytes"] = stage_memory
                frames.append(None if decoded is None else family.postprocess(pipe, decoded))
                sound = None
                if decoded is not None and family.wants_sound(job):
                    with timer.stage("audio_decode", **self._own_columns(job, jobs)):
                        sound = family.soundtrack(pipe, job, row)
                self.last_sounds.append(sound)
        return frames

    def run(self, job: JobSpec) -> JobResult:
        """Generate the job and, on the leader, hand its media and done marker to the writer."""
        result = self.run_batch([job])
        return JobResult(record=result.records[0], timings=result.timings)

    def run_batch(self, jobs: list[JobSpec]) -> BatchResult:
        """Generate a batch (jobs that agree on their batch key) and, on the leader, hand each job's media and
        done marker to the writer. A batch of one is exactly `run` of that job."""
        timer = JobTimer(self.ctx.device)
        model = self.model_for(jobs[0])
        if any(getattr(job, column) is not None for job in jobs for column in MEDIA_COLUMNS):
            with timer.stage("read_media"):  # the rows' input images, once, on this rank
                jobs = [self.with_media(job) for job in jobs]
        jobs = self._prepared(jobs, model, timer)
        try:
            frames = self.generate_batch(jobs, timer, model)
        except JobInterrupted:
            self.store.append_timings(self._timing_rows(timer, jobs))
            raise
        batch = {"batch_id": batch_id([job.id for job in jobs]), "batch_size": len(jobs)}
        records = [{**job.record(), "status": "done", "run_id": self.run_id, "rank": self.ctx.rank,
                    "vae_decode": self.decoder.last_mode, "attention_approximation": label(self.stale), **batch,
                    **{f"{column}_sha256": media.sha256 for column, media in job.media.items()}} for job in jobs]
        if not self.ctx.is_leader:
            return BatchResult(records=records, timings=self._timing_rows(timer, jobs))
        encoded = []
        for job, job_frames, sound in zip(jobs, frames, self.last_sounds, strict=True):
            with timer.stage("encode_media", **self._own_columns(job, jobs)):
                encoded.append(self._encode_media(to_uint8(job_frames), job, model.spec.is_video, sound))
        skipped = sum(interval.extra.get(SKIPPED, 0) for interval in timer.intervals)
        for job, record, (media, ext), sound in zip(jobs, records, encoded, self.last_sounds, strict=True):
            record["output_uri"] = self.store.output_uri(job.id, ext)
            if sound is not None:
                record.update(audio_sample_rate=sound.sample_rate, audio_seconds=sound.seconds)
            seconds = timer.seconds_by_stage(job.id if len(jobs) > 1 else None)
            record.update({f"{stage}_s": value for stage, value in seconds.items()})
            if parse_cache(job.cache).enabled:  # this run's steps only (a resumed job's earlier run had its own)
                record[SKIPPED] = skipped
            record["finished_at"] = time.time()
        timings = self._timing_rows(timer, jobs)
        for job, record, (media, ext) in zip(jobs, records, encoded, strict=True):
            self.writer.submit(self._commit, job, media, ext, record)
        return BatchResult(records=records, timings=timings)

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
    def _encode_media(frames: np.ndarray, job: JobSpec, is_video: bool, sound=None) -> tuple[bytes, str]:
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
