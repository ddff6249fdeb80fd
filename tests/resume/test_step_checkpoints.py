"""Step checkpoints in process, through `JobExecutor.denoise`: a job stopped by a real signal at a step
boundary and resumed by a fresh executor (fresh pipeline, fresh scheduler) from its checkpoint ends with the
latents of an uninterrupted run (max abs diff <= 1e-6), for both presets; tiny-wan's UniPC scheduler is
multistep, so its history (model outputs, order warm-up, last sample) must survive every stop point.
Checkpoints are due every k steps but at most every T seconds (`gen run --checkpoint-every/-seconds`), and
go away when the job is committed."""

from __future__ import annotations

import signal

import pytest
import torch

from genbatch.io import RunStore
from genbatch.runner.checkpoint import CheckpointPolicy
from genbatch.runner.execute import JobInterrupted
from genbatch.runner.timing import JobTimer
from tests.resume.inprocess import SignalAfterStep, executor_on
from tests.support import executor as drive
from tests.support.faulty_proxy import FaultyProxy
from tests.support.runs import job, run_cli, write_manifest

STEPS = 8
JOBS = {
    "tiny-wan": job("tiny-wan", id="wan", num_inference_steps=STEPS, seed=5, negative_prompt="blurry"),
    "tiny-flux": job("tiny-flux", id="flux", num_inference_steps=STEPS, seed=6),
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final latents of each job run straight through."""
    out = str(tmp_path_factory.mktemp("uninterrupted"))
    with executor_on(out) as harness:
        return {name: drive.denoise(harness.executor, spec, JobTimer(harness.device)) for name, spec in JOBS.items()}


def _stop_after(out: str, spec, steps_done: int, signum=signal.SIGUSR1) -> list[int]:
    """Run `spec` until a signal arrives during step `steps_done - 1`; return the steps the run timed."""
    with executor_on(out) as harness:
        timer = SignalAfterStep(harness.device, step=steps_done - 1, signum=signum)
        with pytest.raises(JobInterrupted, match=f"after step {steps_done}"):
            drive.denoise(harness.executor, spec, timer)
        harness.writer.flush()
        assert harness.store.saved == {spec.id: [steps_done]}  # the stop checkpoint, nothing periodic
        return timer.steps()


def _resume(out: str, spec) -> tuple[torch.Tensor, list[int]]:
    with executor_on(out) as harness:
        timer = SignalAfterStep(harness.device)
        latents = drive.denoise(harness.executor, spec, timer)
        return latents, timer.steps()


@pytest.mark.parametrize(("preset", "stop_at"), [
    ("tiny-wan", 1), ("tiny-wan", 2), ("tiny-wan", 5), ("tiny-wan", 7), ("tiny-flux", 3),
])
def test_resumed_latents_equal_an_uninterrupted_run(preset, stop_at, uninterrupted, tmp_path):
    spec = JOBS[preset]
    assert _stop_after(str(tmp_path), spec, stop_at) == list(range(stop_at))
    latents, steps = _resume(str(tmp_path), spec)
    assert steps == list(range(stop_at, STEPS))  # continued from the checkpoint, not from step 0
    assert (latents - uninterrupted[preset]).abs().max().item() <= 1e-6


def test_stopped_twice_by_sigterm_then_resumed(uninterrupted, tmp_path):
    spec = JOBS["tiny-wan"]
    _stop_after(str(tmp_path), spec, 2, signal.SIGTERM)
    with executor_on(str(tmp_path)) as harness:  # resumes at 2, stopped again at 4
        timer = SignalAfterStep(harness.device, step=3, signum=signal.SIGTERM)
        with pytest.raises(JobInterrupted, match="after step 4"):
            drive.denoise(harness.executor, spec, timer)
        assert timer.steps() == [2, 3]
    latents, steps = _resume(str(tmp_path), spec)
    assert steps == list(range(4, STEPS))
    assert (latents - uninterrupted["tiny-wan"]).abs().max().item() <= 1e-6


def test_a_changed_row_does_not_resume_a_stale_checkpoint(uninterrupted, tmp_path):
    spec = JOBS["tiny-flux"]
    _stop_after(str(tmp_path), spec, 3)
    changed = job("tiny-flux", id=spec.id, num_inference_steps=STEPS, seed=spec.seed + 1)
    _, steps = _resume(str(tmp_path), changed)
    assert steps == list(range(STEPS))  # started over: the seed in the checkpoint's fingerprint differs


@pytest.mark.parametrize(("every_steps", "expected"), [(3, [3, 6]), (1, [1, 2, 3, 4, 5, 6, 7]), (0, [])])
def test_checkpoints_every_k_steps(every_steps, expected, tmp_path):
    policy = CheckpointPolicy(every_steps=every_steps, every_seconds=0)
    with executor_on(str(tmp_path), policy) as harness:
        drive.denoise(harness.executor, JOBS["tiny-flux"], JobTimer(harness.device))
        harness.writer.flush()
        assert harness.store.saved.get("flux", []) == expected  # none after the last step: the job is done


def test_checkpoints_at_most_every_t_seconds(tmp_path):
    """Steps slowed to ~0.1 s, every step due by count, T = 0.25 s: a checkpoint exactly at the boundaries
    where T has passed since the last one (boundaries within 30 ms of T are left unjudged, for a loaded
    machine)."""
    seconds, slack = 0.25, 0.03
    policy = CheckpointPolicy(every_steps=1, every_seconds=seconds)
    with executor_on(str(tmp_path), policy) as harness:
        timer = SignalAfterStep(harness.device, step_sleep_s=0.1)
        drive.denoise(harness.executor, JOBS["tiny-flux"], timer)
        harness.writer.flush()
        saved = harness.store.saved.get("flux", [])
    last = timer.intervals[[i.stage for i in timer.intervals].index("denoise_step")].start.clock
    for steps_done, boundary in enumerate(timer.boundaries[:-1], start=1):
        elapsed = boundary - last
        if abs(elapsed - seconds) > slack:
            assert (steps_done in saved) == (elapsed > seconds), (steps_done, elapsed, saved)
        if steps_done in saved:
            last = boundary
    assert saved, "the time rule never fired"


def test_a_committed_job_leaves_no_checkpoint(tmp_path):
    with executor_on(str(tmp_path), CheckpointPolicy(every_steps=2, every_seconds=0)) as harness:
        drive.run(harness.executor, JOBS["tiny-flux"])
        harness.writer.flush()
        assert harness.store.saved == {"flux": [2, 4, 6]}
        assert harness.store.done_ids() == {"flux"}
        assert harness.store.load_checkpoint("flux") is None
        assert harness.store.objects.list_names(harness.store.layout.join("checkpoints")) == []


@pytest.mark.parametrize(("flags", "puts"), [
    (("--checkpoint-every", "4", "--checkpoint-seconds", "0"), 2),  # after steps 4 and 8 of 10
    (("--checkpoint-every", "1", "--checkpoint-seconds", "0"), 9),  # after every step but the last
    (("--checkpoint-every", "1", "--checkpoint-seconds", "3600"), 0),  # due by steps, capped by time
    (("--checkpoint-every", "0", "--checkpoint-seconds", "0"), 0),
])
def test_gen_run_checkpoint_flags(flags, puts, s3_run, tmp_path):
    """What `gen run` writes, counted by a (fault-free) proxy in front of the S3 server: one PUT per
    checkpoint the flags call for, then one DELETE once the job is committed."""
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "owl", "prompt": "an owl", "model": "tiny-flux", "num_inference_steps": 10}])
    with FaultyProxy(s3_run.endpoint.endpoint_url) as proxy:
        options = [f"--storage-option={key}={value}" for key, value in
                   s3_run.endpoint.storage_options(proxy.endpoint_url).items() if key != "client_kwargs"]
        result = run_cli("run", manifest, "--out", s3_run.url, "-q", *flags, *options)
        requests = [(method, path) for method, path, _ in proxy.log if "/checkpoints/" in path]
    assert result.returncode == 0, result.stderr
    assert requests.count(("PUT", f"/{s3_run.bucket}/run/checkpoints/owl.ckpt")) == puts
    assert ("DELETE", f"/{s3_run.bucket}/run/checkpoints/owl.ckpt") in requests
    assert RunStore(s3_run.url, s3_run.storage_options).done_ids() == {"owl"}


def test_an_image_row_resumes_to_the_same_latents_and_a_changed_image_starts_over(tmp_path):
    from PIL import Image

    image = str(tmp_path / "first.png")
    Image.new("RGB", (64, 48), (230, 120, 10)).save(image)
    for preset, stop_at in (("tiny-wan-i2v", 3), ("tiny-wan22-ti2v", 2)):  # conditioning channels; first frame
        spec = job(preset, id=preset, num_inference_steps=STEPS, seed=3, num_frames=5, negative_prompt="grey",
                   image=image)
        with executor_on(str(tmp_path / f"straight-{preset}")) as harness:
            straight = drive.denoise(harness.executor, spec, JobTimer(harness.device))
        assert _stop_after(str(tmp_path / preset), spec, stop_at) == list(range(stop_at))
        latents, steps = _resume(str(tmp_path / preset), spec)
        assert steps == list(range(stop_at, STEPS))
        assert (latents - straight).abs().max().item() <= 1e-6, preset
    spec = job("tiny-wan-i2v", id="changed", num_inference_steps=STEPS, seed=3, num_frames=5, image=image)
    _stop_after(str(tmp_path / "changed"), spec, 3)
    Image.new("RGB", (64, 48), (10, 120, 230)).save(image)  # the same URL, other pixels: another sha256
    _, steps = _resume(str(tmp_path / "changed"), spec)
    assert steps == list(range(STEPS))  # started over


def test_a_lora_row_resumes_to_the_same_latents_and_another_scale_starts_over(tmp_path):
    from dataclasses import replace

    from genbatch.jobs.lora import LoraRef
    from tests.support.lora import peft_lora

    lora = peft_lora("tiny-flux", tmp_path / "style", ("to_q", "to_v", "proj_mlp"))
    spec = replace(JOBS["tiny-flux"], id="styled", lora=(LoraRef(lora, scale=0.8),))
    with executor_on(str(tmp_path / "straight")) as harness:
        straight = drive.denoise(harness.executor, spec, JobTimer(harness.device))
    assert _stop_after(str(tmp_path / "styled"), spec, 3) == [0, 1, 2]
    latents, steps = _resume(str(tmp_path / "styled"), spec)  # a new executor: the adapter switched in again
    assert steps == list(range(3, STEPS))
    assert torch.equal(latents, straight)
    _stop_after(str(tmp_path / "rescaled"), spec, 3)
    _, steps = _resume(str(tmp_path / "rescaled"), replace(spec, lora=(LoraRef(lora, scale=0.5),)))
    assert steps == list(range(STEPS))  # the checkpoint was of another adapter scale: started over
