"""Precedence row > run-level option > model default, and the JobSpec/JobOverrides types."""

import pytest

from genbatch.jobs.resolve import Resolved, SettingResolver, resolve_model_name
from genbatch.jobs.spec import JobOverrides, JobSpec
from genbatch.manifests import read_jobs
from genbatch.models import resolve_model

WAN = resolve_model("tiny-wan")
FLUX = resolve_model("tiny-flux")


def test_row_value_beats_run_option_beats_model_default():
    overrides = JobOverrides(width=96, num_inference_steps=3)
    settings = SettingResolver(overrides, WAN).resolve({"width": 32, "height": None})
    assert settings["width"] == Resolved(32, "row")
    assert settings["num_inference_steps"] == Resolved(3, "run")
    assert settings["height"] == Resolved(WAN.defaults["height"], "model")
    assert settings["num_frames"] == Resolved(WAN.defaults["num_frames"], "model")


def test_image_models_have_no_video_settings_even_when_the_run_sets_them():
    settings = SettingResolver(JobOverrides(num_frames=17, fps=24), FLUX).resolve({})
    assert "num_frames" not in settings and "fps" not in settings
    assert settings["guidance_scale"] == Resolved(FLUX.defaults["guidance_scale"], "model")


def test_model_name_precedence():
    assert resolve_model_name("tiny-flux", JobOverrides(model="tiny-wan")) == "tiny-flux"
    assert resolve_model_name(None, JobOverrides(model="tiny-flux")) == "tiny-flux"
    assert resolve_model_name(None, JobOverrides()) is None  # no default model: the run stops naming --model


def test_precedence_through_read_jobs(write_manifest):
    path = write_manifest(
        id=["row-wins", "run-wins", "default", "flux"],
        prompt=["a", "b", "c", "d"],
        model=[None, None, None, "tiny-flux"],
        width=[32, None, None, None],
        num_inference_steps=[2, None, None, None],
        guidance_scale=[1.5, None, None, None],
        fps=[4, None, None, None],
        num_frames=[5, None, None, None],
    )
    jobs = read_jobs(path, overrides=JobOverrides(model="tiny-wan", width=80, num_inference_steps=3)).jobs
    by_id = {job.id: job for job in jobs}
    assert (by_id["row-wins"].width, by_id["row-wins"].num_inference_steps) == (32, 2)
    assert (by_id["row-wins"].guidance_scale, by_id["row-wins"].fps, by_id["row-wins"].num_frames) == (1.5, 4, 5)
    assert (by_id["run-wins"].width, by_id["run-wins"].num_inference_steps) == (80, 3)
    assert by_id["run-wins"].height == WAN.defaults["height"]
    assert by_id["default"].guidance_scale == WAN.defaults["guidance_scale"]
    assert by_id["default"].fps == WAN.defaults["fps"]
    flux = by_id["flux"]
    assert (flux.model, flux.width, flux.height) == ("tiny-flux", 80, FLUX.defaults["height"])
    assert (flux.num_frames, flux.fps) == (None, None)
    assert flux.num_inference_steps == 3


def test_overrides_reject_bad_values_naming_them():
    with pytest.raises(ValueError, match="width=0"):
        JobOverrides(width=0)
    with pytest.raises(ValueError, match="num_inference_steps=-2"):
        JobOverrides(num_inference_steps=-2)
    with pytest.raises(ValueError, match="guidance_scale=-1"):
        JobOverrides(guidance_scale=-1.0)
    with pytest.raises(ValueError, match="model is empty"):
        JobOverrides(model=" ")


def test_record_flattens_extra_columns():
    job = JobSpec(
        id="a",
        prompt="p",
        negative_prompt=None,
        model="tiny-wan",
        width=64,
        height=48,
        num_frames=9,
        num_inference_steps=8,
        guidance_scale=5.0,
        seed=1,
        fps=8,
        extra={"category": "x", "score": 0.5},
        row=3,
    )
    record = job.record()
    assert record["category"] == "x" and record["score"] == 0.5
    assert record["row"] == 3 and record["seed"] == 1 and record["num_frames"] == 9
    assert "extra" not in record
