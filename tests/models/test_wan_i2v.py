"""Wan 2.1 image-to-video (`tiny-wan-i2v`, with its CLIP image encoder): a row's image, read from its URL by the
rank that runs it, gives the frames `WanImageToVideoPipeline.__call__` gives, first and last frame included and
at an aspect ratio other than the output's; the results row carries each image's sha256 and a changed image
changes the checkpoint's fingerprint; a row's image columns are checked against its model, a relative path is
taken from the manifest's directory, and an unreadable image is named, never shown."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from genbatch.io.media_input import MediaError, MediaReader
from genbatch.jobs.prepared import PreparedJob
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs
from genbatch.runner.execute import fingerprint
from tests.models.pipeline_outputs import genbatch_frames, pipeline_frames
from tests.support.runs import job, run_cli, write_manifest

PRESET = "tiny-wan-i2v"
FLF2V = "tiny-wan-flf2v"  # the first-and-last-frame model
WAN22_I2V = "tiny-wan22-i2v"  # Wan 2.2 I2V-A14B: two experts, no CLIP
TI2V = "tiny-wan22-ti2v"  # Wan 2.2 TI2V-5B: the image as the first latent frame, per-token timesteps


def _png(path, size, colour) -> str:
    Image.new("RGB", size, colour).save(path)
    return str(path)


@pytest.mark.parametrize(("model", "size", "last"), [
    (PRESET, (64, 48), False), (PRESET, (40, 80), False), (FLF2V, (64, 48), True),
    (WAN22_I2V, (64, 48), False), (WAN22_I2V, (40, 80), False), (TI2V, (64, 64), False), (TI2V, (40, 80), False),
], ids=["same-aspect", "other-aspect", "first-and-last-frame", "wan22-i2v-same-aspect", "wan22-i2v-other-aspect",
        "wan22-ti2v-same-aspect", "wan22-ti2v-other-aspect"])
def test_output_equals_the_diffusers_pipeline(tmp_path, model, size, last):
    first = _png(tmp_path / "first.png", size, (250, 240, 20))
    final = _png(tmp_path / "last.png", size, (10, 30, 200)) if last else None
    spec_job = job(model, seed=21, num_inference_steps=3, num_frames=5, image=first, last_image=final,
                   negative_prompt="grey")
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    call = {"last_image": Image.open(final)} if last else {}
    theirs = pipeline_frames(model, spec_job, image=Image.open(first), num_frames=5, negative_prompt="grey",
                             guidance_scale=spec_job.guidance_scale, **call)
    assert ours.shape == theirs.shape == (5, spec_job.height, spec_job.width, 3)
    np.testing.assert_array_equal(ours, theirs)


def test_wan22_i2v_runs_both_experts_without_clip(tmp_path):
    import torch

    from genbatch.models import family, resolve_model
    from genbatch.runner.loading import load_pipeline

    pipe = load_pipeline(resolve_model(WAN22_I2V), torch.device("cpu"), torch.float32)
    image = _png(tmp_path / "first.png", (64, 48), (1, 2, 3))
    spec_job = job(WAN22_I2V, num_inference_steps=3, num_frames=5, image=image)
    spec_job = PreparedJob.of(spec_job, media={"image": MediaReader().read("image", image)})
    hooks = family("wan-i2v").hooks
    trajectory = hooks.trajectory(pipe, spec_job, torch.Generator().manual_seed(0), torch.device("cpu"))
    experts = [hooks.denoiser_at(pipe, trajectory, t) for t in trajectory.timesteps]
    assert experts[0] is pipe.transformer and experts[-1] is pipe.transformer_2 and pipe.image_encoder is None
    branches = hooks.encode(pipe, spec_job, torch.device("cpu")).branches
    assert all("encoder_hidden_states_image" not in branch for branch in branches.values())


def test_wan22_ti2v_without_an_image_is_text_to_video_and_its_wanpipeline_directory_takes_one(tmp_path):
    import torch
    from diffusers import WanImageToVideoPipeline, WanPipeline

    from genbatch.models import resolve_model
    from genbatch.runner.loading import load_pipeline

    i2v = load_pipeline(resolve_model(TI2V), torch.device("cpu"), torch.float32)
    text_to_video = WanPipeline(tokenizer=i2v.tokenizer, text_encoder=i2v.text_encoder, transformer=i2v.transformer,
                                vae=i2v.vae, scheduler=i2v.scheduler, expand_timesteps=True)
    spec_job = job(TI2V, seed=4, num_inference_steps=3, num_frames=5, negative_prompt="grey")
    call = dict(prompt=spec_job.prompt, negative_prompt="grey", height=64, width=64, num_frames=5,
                num_inference_steps=3, guidance_scale=spec_job.guidance_scale, output_type="np")
    theirs = text_to_video(generator=torch.Generator("cpu").manual_seed(4), **call).frames[0]
    np.testing.assert_array_equal(genbatch_frames(TI2V, spec_job, str(tmp_path / "t2v")), theirs)
    # Wan 2.2 TI2V-5B ships as a WanPipeline (expand_timesteps): it takes an image too
    directory = str(tmp_path / "ti2v")
    text_to_video.save_pretrained(directory)
    spec = resolve_model(directory)
    assert (spec.family, spec.media_inputs, spec.media_required) == ("wan-i2v", ("image",), ())
    image = _png(tmp_path / "first.png", (64, 64), (20, 200, 90))
    started = genbatch_frames(directory, replace(spec_job, model=directory, image=image), str(tmp_path / "i2v"))
    reference = WanImageToVideoPipeline.from_pretrained(directory)(
        image=Image.open(image), generator=torch.Generator("cpu").manual_seed(4), **call).frames[0]
    np.testing.assert_array_equal(started, reference)


def test_the_image_is_used(tmp_path):
    frames = [genbatch_frames(PRESET, job(PRESET, seed=3, num_inference_steps=2, num_frames=5,
                                          image=_png(tmp_path / f"{colour}.png", (64, 48), (colour,) * 3)),
                              str(tmp_path / f"out{colour}")) for colour in (0, 255)]
    assert np.abs(frames[0] - frames[1]).max() * 255 > 20  # black and white first frames: levels apart


def test_a_changed_image_changes_the_fingerprint_and_a_text_job_keeps_its_own(tmp_path):
    reader = MediaReader()
    spec_job = job(PRESET, image=_png(tmp_path / "a.png", (64, 48), (1, 2, 3)))
    before = fingerprint(PreparedJob.of(spec_job, media={"image": reader.read("image", spec_job.image)}))
    _png(tmp_path / "a.png", (64, 48), (3, 2, 1))
    after = fingerprint(PreparedJob.of(spec_job, media={"image": reader.read("image", spec_job.image)}))
    assert before != after and before["media"]["image"] != after["media"]["image"]
    assert "media" not in fingerprint(PreparedJob.of(job("tiny-wan")))  # checkpoints of text rows resume as before


def test_an_unreadable_image_is_named_and_never_shown(tmp_path):
    secret = b"AWS_SECRET_ACCESS_KEY=do-not-print-me\n"
    (tmp_path / "text.png").write_bytes(secret)
    good = tmp_path / "good.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(good)
    (tmp_path / "truncated.png").write_bytes(good.read_bytes()[:-200])  # the header whole, the pixels cut
    reader = MediaReader()
    for name, reason in (("text.png", "not an image"), ("truncated.png", "a damaged image"),
                         ("missing.png", "no such file")):
        with pytest.raises(MediaError, match=reason) as caught:
            reader.read("image", str(tmp_path / name))
        assert f"column 'image': {tmp_path / name}" in str(caught.value) and "do-not-print-me" not in str(caught.value)
    media = reader.read("image", str(good))
    assert media.sha256 == hashlib.sha256(good.read_bytes()).hexdigest() and media.image.size == (32, 32)


def test_image_columns_are_checked_against_the_model_and_relative_paths_follow_the_manifest(tmp_path):
    rows = [
        {"id": "relative", "prompt": "a boat", "model": PRESET, "image": "frames/a.png"},
        {"id": "absolute", "prompt": "a boat", "model": FLF2V, "image": "/data/b.png", "last_image": "../c.png"},
        {"id": "no-last", "prompt": "a boat", "model": FLF2V, "image": "b.png"},
        {"id": "last-for-i2v", "prompt": "a boat", "model": PRESET, "image": "b.png", "last_image": "c.png"},
        {"id": "url", "prompt": "a boat", "model": PRESET, "image": "s3://bucket/d.png"},
        {"id": "no-image", "prompt": "a boat", "model": PRESET},
        {"id": "text-model", "prompt": "a boat", "model": "tiny-wan", "image": "a.png"},
        {"id": "last-for-flux", "prompt": "a boat", "model": "tiny-flux", "last_image": "a.png"},
        {"id": "empty", "prompt": "a boat", "model": PRESET, "image": " "},
        {"id": "plain", "prompt": "a boat", "model": "tiny-wan"},
    ]
    url = write_manifest(str(tmp_path / "m.parquet"), rows)
    result = read_jobs(url, overrides=JobOverrides(), check_media=False)  # the column rules alone: no files here
    jobs = {spec.id: spec for spec in result.jobs}
    assert jobs["relative"].image == str(tmp_path / "frames" / "a.png")
    assert (jobs["absolute"].image, jobs["absolute"].last_image) == ("/data/b.png", str(tmp_path.parent / "c.png"))
    assert jobs["url"].image == "s3://bucket/d.png" and jobs["plain"].image is None
    reasons = {(rejection.job_id, rejection.column): rejection.reason for rejection in result.rejected}
    assert set(reasons) == {("no-image", "image"), ("text-model", "image"), ("last-for-flux", "last_image"),
                            ("empty", "image"), ("no-last", "last_image"), ("last-for-i2v", "last_image")}
    assert "tiny-wan-i2v takes no last_image (it takes image only)" in reasons[("last-for-i2v", "last_image")]
    assert "starts from an image, and the row names none" in reasons[("no-image", "image")]
    assert "tiny-wan takes no image (it is a text-only model)" in reasons[("text-model", "image")]


def test_gen_run_records_each_image_and_its_sha256(tmp_path):  # `gen run` end to end, in this process
    (tmp_path / "frames").mkdir()
    image = _png(tmp_path / "frames" / "fox.png", (64, 48), (200, 90, 10))
    rows = [{"id": "clip", "prompt": "a fox", "model": PRESET, "image": "frames/fox.png", "num_frames": 5,
             "num_inference_steps": 2},
            {"id": "broken", "prompt": "a fox", "model": PRESET, "image": "frames/broken.png", "num_frames": 5,
             "num_inference_steps": 2},
            {"id": "missing", "prompt": "a fox", "model": PRESET, "image": "frames/none.png", "num_frames": 5,
             "num_inference_steps": 2}]
    (tmp_path / "frames" / "broken.png").write_bytes(b"not a picture")
    out = tmp_path / "out"
    result = run_cli("run", write_manifest(str(tmp_path / "m.parquet"), rows), "--out", str(out), "-q")
    assert result.returncode == 1, result.stderr[-3000:]  # one job failed, the other ran
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert results["clip"]["status"] == "done" and results["clip"]["image"] == image
    assert results["clip"]["image_sha256"] == hashlib.sha256(open(image, "rb").read()).hexdigest()
    assert results["broken"]["status"] == "failed" and "frames/broken.png: not an image" in results["broken"]["error"]
    assert results["missing"]["status"] == "rejected"  # found missing by the listing, before any rank read it
    assert (out / "outputs" / "clip.mp4").exists()


def _layouts_on_ranks(rank, world_size, cases, out):
    from tests.parallel.test_layouts import _run_job

    return [_run_job(spec_job, *layout, out=f"{out}/{index}") for index, (spec_job, *layout) in enumerate(cases)]


def test_sequence_cfg_fsdp_and_tp_layouts_equal_one_process(tmp_path):
    from tests.parallel.test_layouts import _check, _run_job
    from tests.support.distributed import run_on_ranks

    image = _png(tmp_path / "first.png", (80, 48), (240, 200, 30))
    jobs = [job(PRESET, width=80, height=48, num_inference_steps=3, seed=17, negative_prompt="grey",
                image=image),  # 45 video tokens: uneven over 2 ranks
            job(WAN22_I2V, width=80, height=48, num_inference_steps=3, seed=17, negative_prompt="grey", image=image),
            # 9 tokens, each with its own timestep (the first frame's at 0): uneven, the timesteps split with them
            job(TI2V, width=96, height=32, num_inference_steps=3, seed=17, negative_prompt="grey", image=image)]
    # (dp, cfg, ring, ulysses, fsdp[, tp])
    layouts = [(1, 1, 1, 2, False), (1, 2, 1, 1, False), (1, 1, 2, 1, False), (1, 1, 1, 2, True), (1, 1, 1, 1, False, 2)]
    cases = [(spec_job, *layout) for spec_job in jobs for layout in layouts]
    per_rank = run_on_ranks(_layouts_on_ranks, 2, args=(cases, str(tmp_path / "ranks")), timeout_s=90)
    reference = {spec_job.model: _run_job(spec_job, None, 1, 1, 1, False, out=str(tmp_path / f"one-{index}"))
                 for index, spec_job in enumerate(jobs)}
    _check(cases, per_rank, reference)


def test_images_are_read_from_s3_under_the_storage_timeout(s3_run, tmp_path):
    from genbatch.io.retry import RetryPolicy

    local = _png(tmp_path / "fox.png", (16, 16), (5, 100, 200))
    url = f"{s3_run.url}/frames/fox.png"
    s3_run.endpoint.filesystem().pipe(url.removeprefix("s3://"), open(local, "rb").read())
    reader = MediaReader(storage_options=s3_run.storage_options, retry=RetryPolicy(timeout_s=5))
    media = reader.read("image", url)
    assert media.sha256 == hashlib.sha256(open(local, "rb").read()).hexdigest() and media.image.size == (16, 16)
    with pytest.raises(MediaError, match=r"column 'image': s3://.*/frames/none.png: no such file"):
        reader.read("image", f"{s3_run.url}/frames/none.png")


def test_a_missing_image_rejects_its_row_alone_by_one_listing_per_folder(tmp_path, monkeypatch):
    import fsspec.implementations.local as local

    from click.testing import CliRunner

    from genbatch.cli import main

    (tmp_path / "frames").mkdir()
    _png(tmp_path / "frames" / "here.png", (64, 48), (1, 1, 1))
    rows = [{"id": f"here-{i}", "prompt": "a boat", "model": PRESET, "image": "frames/here.png"} for i in range(3)]
    rows += [{"id": "gone", "prompt": "a boat", "model": PRESET, "image": "frames/gone.png"},
             {"id": "nowhere", "prompt": "a boat", "model": PRESET, "image": "elsewhere/x.png"},
             {"id": "text", "prompt": "a boat", "model": "tiny-wan"}]
    url = write_manifest(str(tmp_path / "m.parquet"), rows)
    listings = []
    listed = local.LocalFileSystem.ls
    monkeypatch.setattr(local.LocalFileSystem, "ls", lambda self, path, *a, **k: listings.append(path) or listed(
        self, path, *a, **k))
    result = read_jobs(url, overrides=JobOverrides())
    assert sorted(listings) == sorted([str(tmp_path / "frames"), str(tmp_path / "elsewhere")])  # once per folder
    assert sorted(job.id for job in result.jobs) == ["here-0", "here-1", "here-2", "text"]
    reasons = {rejection.job_id: (rejection.column, rejection.full_reason) for rejection in result.rejected}
    assert reasons["gone"] == ("image", f"{tmp_path / 'frames' / 'gone.png'}: no such file; check the path (a "
                                        "relative one is taken from the manifest's directory)")
    assert set(reasons) == {"gone", "nowhere"}
    report = CliRunner().invoke(main, ["validate", url])
    assert report.exit_code == 1 and "6 rows, 4 valid, 2 rejected" in report.output
    # one line per cause, with its count, each row beside its own URL
    (line,) = [line for line in report.output.splitlines() if "no such file" in line]
    assert line.startswith("2 rows: column 'image': no such file; check the path")
    assert f"row 3 (id 'gone'): {tmp_path / 'frames' / 'gone.png'}" in line
    assert f"row 4 (id 'nowhere'): {tmp_path / 'elsewhere' / 'x.png'}" in line
    skipped = CliRunner().invoke(main, ["validate", url, "--no-check-media"])
    assert skipped.exit_code == 0 and "6 rows, 6 valid, 0 rejected" in skipped.output
