"""LTX-2 (video with sound): a job's frames and waveform equal `LTX2Pipeline`'s own for the same row and generator
(identical frames, the identical waveform), from the preset and from a saved directory, at two sizes; the MP4 has
one H.264 video and one AAC audio stream whose sound, decoded back and aligned, is the waveform's; the layouts
equal one process, frames and sound alike; the video VAE decodes patch-parallel as one rank does; a job stopped
after step k resumes to the same frames and sound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genbatch.io.sound import AAC_FRAME, decode_sound, streams
from genbatch.models import family, resolve_model
from genbatch.models.ltx2 import CFG, PERTURBED, TINY_VAE
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import saved_preset
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

PRESET = "tiny-ltx2"
JOB = job(PRESET, seed=4321, negative_prompt="dull", num_inference_steps=3)

LAYOUTS = [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 1, False, 2), (1, 1, 1, 2, True), (1, 2, 1, 1, False)]
"""(dp, cfg, ring, ulysses, fsdp[, tp]) on two ranks: ulysses 2, ring 2, tp 2, ulysses 2 with --fsdp, cfg 2."""

AAC_CORRELATION = 0.99
"""The least correlation of the AAC round trip with the waveform, once aligned (measured: 0.995 on the tiny waveform)."""
AAC_SNR_DB = 17.0
"""The least signal-to-noise ratio of the round trip (measured: 20 dB at 128 kbit/s on the tiny waveform, whose random
layers leave more of it above 2 kHz than speech has)."""


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return saved_preset(PRESET, tmp_path_factory.mktemp("ltx2") / "model")


def genbatch_outputs(model: str, spec_job, out: str, **layout):
    """(final latents, [0, 1] frames, waveform) of `spec_job` through genbatch's executor (None off the leader)."""
    with job_executor(out, model=model, **layout) as (world, executor):
        timer = JobTimer(world.ctx.device)
        latents = drive.denoise(executor, spec_job, timer)
        output = drive.decode_row(executor, spec_job, latents, timer)
        return latents, output.frames, output.sound


def pipeline_outputs(model: str, spec_job):
    """(frames, waveform (channels, samples)) of the pipeline's own `__call__` for the job."""
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    output = pipe(prompt=spec_job.prompt, negative_prompt=spec_job.negative_prompt, height=spec_job.height,
                  width=spec_job.width, num_frames=spec_job.num_frames, frame_rate=spec_job.fps,
                  num_inference_steps=spec_job.num_inference_steps, guidance_scale=spec_job.guidance_scale,
                  generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np")
    return output.frames[0], output.audio[0].float().numpy(), int(pipe.vocoder.config.output_sampling_rate)


@pytest.mark.parametrize(("from_directory", "size"), [(False, (96, 64)), (True, (64, 128))],
                         ids=["preset-96x64", "directory-64x128"])
def test_frames_and_waveform_equal_the_diffusers_pipeline(from_directory, size, directory, tmp_path):
    model = directory if from_directory else PRESET
    width, height = size
    spec_job = job(PRESET, model=model, seed=4321, negative_prompt="dull", num_inference_steps=3, width=width,
                   height=height)
    _, frames, sound = genbatch_outputs(model, spec_job, str(tmp_path / "out"))
    theirs, waveform, rate = pipeline_outputs(model, spec_job)
    assert frames.shape == theirs.shape == (9, height, width, 3)
    np.testing.assert_array_equal(frames, theirs)
    # the waveform genbatch hands the encoder is the pipeline's, bit for bit, at the vocoder's rate
    assert sound.samples.shape == waveform.shape and sound.samples.shape[0] == 2
    np.testing.assert_array_equal(sound.samples, waveform)
    assert sound.sample_rate == rate == 16000
    assert frames.std() > 0.01 and waveform.std() > 0.01


def test_a_step_runs_the_pipelines_forwards_in_two_branches():
    """Under the call's defaults every guidance is on: the cfg branch runs [negative, positive] in one forward, the
    perturbed branch the STG and the modality-isolated forwards; each predicts two rows, so cfg 2 splits them."""
    pipe = load_pipeline(resolve_model(PRESET), torch.device("cpu"), torch.float32)
    hooks = family("ltx2").hooks
    conditioning = hooks.encode(pipe, JOB, torch.device("cpu"))
    assert list(conditioning.branches) == [CFG, PERTURBED]
    assert conditioning.branches[CFG]["forwards"] == ("negative", "positive")
    assert conditioning.branches[PERTURBED]["forwards"] == ("stg", "modality")
    trajectory = hooks.trajectory(pipe, JOB, torch.Generator().manual_seed(1), torch.device("cpu"))
    with torch.no_grad():
        shapes = {name: hooks.predict(pipe, trajectory, trajectory.latents, trajectory.timesteps[0], 0, branch).shape
                  for name, branch in conditioning.branches.items()}
    assert shapes == {CFG: (2, trajectory.latents.shape[1]), PERTURBED: (2, trajectory.latents.shape[1])}


def test_the_mp4_has_one_video_and_one_aac_stream_carrying_the_waveform_and_the_report_plays_it(tmp_path):
    from tests.resume.inprocess import executor_on

    with executor_on(str(tmp_path / "run")) as harness:
        result = drive.run(harness.executor, JOB)
        harness.writer.flush()
        sound = drive.decode_row(harness.executor, JOB, drive.denoise(harness.executor, JOB, JobTimer(harness.device)),
                                 JobTimer(harness.device)).sound  # the same job again: its sound, as run wrote it
    record = result.records[0]
    with open(record["output_uri"].removeprefix("file://"), "rb") as handle:
        mp4 = handle.read()
    assert streams(mp4) == ["video", "audio"]
    assert record["audio_sample_rate"] == 16000
    assert record["audio_seconds"] == pytest.approx(sound.samples.shape[1] / 16000)
    decoded = decode_sound(mp4)
    assert decoded.sample_rate == sound.sample_rate and decoded.channels == sound.channels
    samples = sound.samples.shape[1]
    # as long as the waveform, within the codec's framing: whole AAC frames, the priming trimmed by the edit list
    assert samples <= decoded.samples.shape[1] <= (samples // AAC_FRAME + 2) * AAC_FRAME
    correlation, snr = _aligned_quality(sound.samples, decoded.samples)
    print({"correlation": correlation, "snr_db": snr, "decoded": decoded.samples.shape, "waveform": samples})
    assert correlation >= AAC_CORRELATION and snr >= AAC_SNR_DB

    # gen report plays it: the card's video is not muted, its preview keeps the track, the card says so
    from tests.support.runs import run_cli

    assert run_cli("report", str(tmp_path / "run")).returncode == 0
    report = tmp_path / "run" / "report"
    index = (report / "index.html").read_text(encoding="utf-8")
    assert "<video controls loop" in index and " muted" not in index
    assert f"<dt>sound</dt><dd>16000 Hz, {samples / 16000:.3g} s</dd>" in index
    (preview,) = (report / "videos").iterdir()
    assert streams(preview.read_bytes()) == ["video", "audio"]


def _aligned_quality(waveform: np.ndarray, decoded: np.ndarray) -> tuple[float, float]:
    """(correlation, SNR in dB) of the decoded sound against the waveform at the best offset within one AAC frame
    (the encoder's priming delay is 1024 samples; ffmpeg's decoder trims it by the MP4's edit list)."""
    best = (-1.0, -np.inf)
    n = waveform.shape[1]
    for offset in range(0, AAC_FRAME + 1):
        if offset + n > decoded.shape[1]:
            break
        part = decoded[:, offset:offset + n]
        correlation = float(np.corrcoef(waveform.ravel(), part.ravel())[0, 1])
        if correlation > best[0]:
            noise = np.sum((part - waveform) ** 2)
            best = (correlation, float(10 * np.log10(np.sum(waveform ** 2) / max(noise, 1e-20))))
    return best


def _layouts_and_vae(rank, world_size, spec_job, layouts, out):
    """Every layout's (latents, frames, waveform) on this rank, then the video VAE's patch-parallel decode."""
    outputs = []
    for index, (dp, cfg, ring, ulysses, fsdp, *rest) in enumerate(layouts):
        latents, frames, sound = genbatch_outputs(PRESET, spec_job, f"{out}/{index}/rank{rank}", dp=dp, cfg=cfg,
                                                  ring=ring, ulysses=ulysses, fsdp=fsdp, tp=rest[0] if rest else 1)
        outputs.append((latents, frames, None if sound is None else sound.samples))
    return outputs, _vae_decodes(rank, world_size)


VAE_LATENTS = [(1, 8, 2, 3, 5), (1, 8, 3, 2, 2), (1, 8, 2, 5, 3)]
"""Video latents (b, c, f, h, w): wider than high, a 2x2 latent (2-D tiles at 4 ranks), heights 3 and 5 that do not
divide by the ranks."""


def _vae_decodes(rank, world_size):
    """max |patch-parallel - one rank| of the tiny video VAE's decode of each of `VAE_LATENTS`, and why it cannot
    decode tile-parallel (None: it can)."""
    import torch.distributed as dist
    from diffusers import AutoencoderKLLTX2Video

    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_decode, unsupported_reason

    torch.manual_seed(3)
    vae = AutoencoderKLLTX2Video(**TINY_VAE).eval()
    diffs = []
    for shape in VAE_LATENTS:
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            whole = vae.decode(latents, None, return_dict=False)[0]
            tiled = parallel_decode(vae, latents, Comm(dist.group.WORLD, CommLedger()), leader_only=False)
        diffs.append((tiled - whole).abs().max().item())
    return unsupported_reason(vae), diffs


def test_layouts_equal_one_process_frames_and_sound_and_the_vae_decodes_on_two_ranks(tmp_path):
    """ulysses 2, ring 2, tp 2, --fsdp and cfg 2 (one run_on_ranks call), by tests/parallel/test_layouts.py's
    criteria, the waveform within 1e-4; the video VAE's patch-parallel decode within 1e-4 (test_vae.py's)."""
    from tests.parallel.test_layouts import _check

    # 27 video tokens (3 latent frames of 3 x 3): uneven over two ranks
    spec_job = job(PRESET, seed=21, negative_prompt="dull", num_inference_steps=2, width=96, height=96, num_frames=17)
    per_rank = run_on_ranks(_layouts_and_vae, 2, args=(spec_job, LAYOUTS, str(tmp_path / "ranks")), timeout_s=120)
    reference = genbatch_outputs(PRESET, spec_job, str(tmp_path / "one"))
    cases = [(spec_job, *layout) for layout in LAYOUTS]
    _check(cases, [[(latents, frames) for latents, frames, _ in outputs] for outputs, _ in per_rank],
           {PRESET: reference[:2]})
    for index, layout in enumerate(LAYOUTS):
        sounds = [outputs[index][2] for outputs, _ in per_rank if outputs[index][2] is not None]
        assert sounds, layout
        for sound in sounds:
            assert np.abs(sound - reference[2].samples).max() <= 1e-4, layout
    for reason, diffs in (vae for _, vae in per_rank):
        assert reason is None and max(diffs) <= 1e-4, (reason, diffs)


@pytest.mark.slow
def test_the_video_vae_decodes_patch_parallel_on_four_ranks():
    for reason, diffs in run_on_ranks(_vae_decodes, 4, timeout_s=120):
        assert reason is None and max(diffs) <= 1e-4, (reason, diffs)


@pytest.mark.slow  # test_step_checkpoints.py holds a resume after step k (Wan, FLUX) in make test; here the sound
def test_a_job_stopped_after_step_k_resumes_to_the_same_frames_and_sound(tmp_path):
    from genbatch.runner.execute import JobInterrupted
    from tests.resume.inprocess import SignalAfterStep, executor_on

    spec_job = job(PRESET, id="resumed", seed=8, negative_prompt="dull", num_inference_steps=4)
    with executor_on(str(tmp_path / "straight")) as harness:
        timer = JobTimer(harness.device)
        straight_row = drive.decode_row(harness.executor, spec_job, drive.denoise(harness.executor, spec_job, timer),
                                        timer)
        straight, straight_sound = straight_row.frames, straight_row.sound
    out = str(tmp_path / "stopped")
    with executor_on(out) as harness:
        with pytest.raises(JobInterrupted, match="after step 2"):
            drive.denoise(harness.executor, spec_job, SignalAfterStep(harness.device, step=1))
        harness.writer.flush()
        assert harness.store.saved == {"resumed": [2]}
    with executor_on(out) as harness:
        timer = SignalAfterStep(harness.device)
        resumed_row = drive.decode_row(harness.executor, spec_job, drive.denoise(harness.executor, spec_job, timer),
                                       timer)
        resumed, resumed_sound = resumed_row.frames, resumed_row.sound
        assert timer.steps() == [2, 3]  # from the checkpoint, not from step 0
    np.testing.assert_array_equal(resumed, straight)
    np.testing.assert_array_equal(resumed_sound.samples, straight_sound.samples)


def test_gen_plan_counts_the_published_models_audio_tokens():
    import json

    from click.testing import CliRunner

    from genbatch.cli import main
    from genbatch.planner.shapes import published_shape, resolve_shape

    (published,) = family("ltx2").published
    assert resolve_shape("ltx-2") == published_shape(family("ltx2"), published)
    result = CliRunner().invoke(main, ["plan", "--model", "ltx-2", "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    # 768x512, 121 frames: 16 latent frames of 16 x 24 video tokens, and 5.04 s of audio at 25 tokens a second
    assert data["workload"]["tokens"] == 16 * 16 * 24 + 126
    assert any(layout["cfg"] == 2 for layout in data["layouts"])


def test_the_hub_id_resolves_from_the_hub_cache(directory, tmp_path, monkeypatch):
    from tests.support.hub import add_snapshot

    cache = str(tmp_path / "hub")
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = add_snapshot(cache, "Lightricks/LTX-2", directory, commit)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    try:
        spec = resolve_model("Lightricks/LTX-2")
        assert (spec.family, spec.path, spec.is_video, spec.uses_cfg) == ("ltx2", snapshot, True, True)
        assert (spec.size_multiple, spec.frame_multiple, spec.vae_spatial) == (32, 8, 32)
    finally:
        resolve_model.cache_clear()


@pytest.mark.slow
def test_gen_run_batches_two_rows_each_with_its_sound(tmp_path):
    """`--batch-size 2`: the rows denoise in one forward a branch (their latents within the layouts' 1e-5 of each
    row's alone) and each MP4 carries its own sound track, its row recording it."""
    import pyarrow.parquet as pq

    from tests.support.runs import run_cli, write_manifest

    rows = [job(PRESET, id="surf", prompt="waves on a beach", negative_prompt="dull", num_inference_steps=2, seed=1),
            job(PRESET, id="wind", prompt="wind in the trees", negative_prompt="dull", num_inference_steps=2, seed=2)]
    with job_executor(str(tmp_path / "alone")) as (world, executor):
        timer = JobTimer(world.ctx.device)
        alone = torch.cat([drive.denoise(executor, row, timer) for row in rows])
        batched = drive.denoise_batch(executor, rows, timer)
    assert (batched - alone).abs().max().item() <= 1e-5
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": row.id, "prompt": row.prompt, "negative_prompt": row.negative_prompt, "model": PRESET, "seed": row.seed,
         "num_inference_steps": 2} for row in rows])
    out = tmp_path / "out"
    result = run_cli("run", manifest, "--out", str(out), "-q", "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    for row in rows:
        record = results[row.id]
        assert (record["status"], record["batch_size"], record["audio_sample_rate"]) == ("done", 2, 16000)
        assert streams((out / "outputs" / f"{row.id}.mp4").read_bytes()) == ["video", "audio"]
