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
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs
from genbatch.runner.execute import fingerprint
from tests.models.pipeline_outputs import genbatch_frames, pipeline_frames
from tests.support.runs import gen, job, write_manifest

PRESET = "tiny-wan-i2v"
FLF2V = "tiny-wan-flf2v"  # the first-and-last-frame model


def _png(path, size, colour) -> str:
    Image.new("RGB", size, colour).save(path)
    return str(path)


@pytest.mark.parametrize(("size", "last"), [((64, 48), False), ((40, 80), False), ((64, 48), True)],
                         ids=["same-aspect", "other-aspect", "first-and-last-frame"])
def test_output_equals_the_diffusers_pipeline(tmp_path, size, last):
    first = _png(tmp_path / "first.png", size, (250, 240, 20))
    final = _png(tmp_path / "last.png", size, (10, 30, 200)) if last else None
    model = FLF2V if last else PRESET
    spec_job = job(model, seed=21, num_inference_steps=2, num_frames=5, image=first, last_image=final)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    call = {"last_image": Image.open(final)} if last else {}
    theirs = pipeline_frames(model, spec_job, image=Image.open(first), num_frames=5,
                             guidance_scale=spec_job.guidance_scale, **call)
    assert ours.shape == theirs.shape == (5, 48, 64, 3)
    np.testing.assert_array_equal(ours, theirs)


def test_the_image_is_used(tmp_path):
    frames = [genbatch_frames(PRESET, job(PRESET, seed=3, num_inference_steps=2, num_frames=5,
                                          image=_png(tmp_path / f"{colour}.png", (64, 48), (colour,) * 3)),
                              str(tmp_path / f"out{colour}")) for colour in (0, 255)]
    assert np.abs(frames[0] - frames[1]).max() * 255 > 20  # black and white first frames: levels apart


def test_a_changed_image_changes_the_fingerprint_and_a_text_job_keeps_its_own(tmp_path):
    reader = MediaReader()
    spec_job = job(PRESET, image=_png(tmp_path / "a.png", (64, 48), (1, 2, 3)))
    before = fingerprint(replace(spec_job, media={"image": reader.read("image", spec_job.image)}))
    _png(tmp_path / "a.png", (64, 48), (3, 2, 1))
    after = fingerprint(replace(spec_job, media={"image": reader.read("image", spec_job.image)}))
    assert before != after and before["media"]["image"] != after["media"]["image"]
    assert "media" not in fingerprint(job("tiny-wan"))  # checkpoints of text rows resume as before


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


@pytest.mark.processes  # `gen run` end to end: the results table, read by a fresh run of the CLI
def test_gen_run_records_each_image_and_its_sha256(tmp_path):
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
    result = gen("run", write_manifest(str(tmp_path / "m.parquet"), rows), "--out", str(out), "-q")
    assert result.returncode == 1, result.stderr[-3000:]  # one job failed, the other ran
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert results["clip"]["status"] == "done" and results["clip"]["image"] == image
    assert results["clip"]["image_sha256"] == hashlib.sha256(open(image, "rb").read()).hexdigest()
    assert results["broken"]["status"] == "failed" and "frames/broken.png: not an image" in results["broken"]["error"]
    assert results["missing"]["status"] == "rejected"  # found missing by the listing, before any rank read it
    assert (out / "outputs" / "clip.mp4").exists()


def _layouts_on_ranks(rank, world_size, spec_job, layouts, out):
    from tests.parallel.test_layouts import _run_job

    return [_run_job(spec_job, *layout, out=f"{out}/{index}") for index, layout in enumerate(layouts)]


def test_sequence_cfg_fsdp_and_tp_layouts_equal_one_process(tmp_path):
    from tests.parallel.test_layouts import _check, _run_job
    from tests.support.distributed import run_on_ranks

    image = _png(tmp_path / "first.png", (80, 48), (240, 200, 30))
    spec_job = job(PRESET, width=80, height=48, num_inference_steps=3, seed=17, negative_prompt="grey",
                   image=image)  # 45 video tokens: uneven over 2 ranks
    # (dp, cfg, ring, ulysses, fsdp[, tp])
    layouts = [(1, 1, 1, 2, False), (1, 2, 1, 1, False), (1, 1, 2, 1, False), (1, 1, 1, 2, True), (1, 1, 1, 1, False, 2)]
    per_rank = run_on_ranks(_layouts_on_ranks, 2, args=(spec_job, layouts, str(tmp_path / "ranks")), timeout_s=60)
    reference = {PRESET: _run_job(spec_job, None, 1, 1, 1, False, out=str(tmp_path / "one"))}
    _check([(spec_job, *layout) for layout in layouts], per_rank, reference)


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
    reasons = {rejection.job_id: (rejection.column, rejection.reason) for rejection in result.rejected}
    assert reasons["gone"] == ("image", f"{tmp_path / 'frames' / 'gone.png'}: no such file; check the path (a "
                                        "relative one is taken from the manifest's directory)")
    assert set(reasons) == {"gone", "nowhere"}
    report = CliRunner().invoke(main, ["validate", url])
    assert report.exit_code == 1 and "6 rows, 4 valid, 2 rejected" in report.output
    assert "no such file" in report.output
    skipped = CliRunner().invoke(main, ["validate", url, "--no-check-media"])
    assert skipped.exit_code == 0 and "6 rows, 6 valid, 0 rejected" in skipped.output
