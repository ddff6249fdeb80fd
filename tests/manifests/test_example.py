"""The shipped example manifest is what examples/make_manifest.py writes, and it validates clean."""

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests import read_jobs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_script():
    spec = importlib.util.spec_from_file_location("make_manifest", EXAMPLES / "make_manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_manifest_matches_the_script(tmp_path):
    written = load_script().main(str(tmp_path / "m.parquet"))
    assert pq.read_table(written).equals(pq.read_table(EXAMPLES / "manifest.parquet"))
    shipped, made = (Image.open(folder / "images" / "lighthouse.png") for folder in (EXAMPLES, tmp_path))
    assert shipped.tobytes() == made.tobytes() and shipped.size == (64, 48)


def test_shipped_manifest_mixes_video_and_image_rows_and_is_valid():
    result = read_jobs(str(EXAMPLES / "manifest.parquet"), overrides=JobOverrides(model="tiny-wan"))
    assert not result.rejected and len(result.jobs) == 17 and result.rows == 16  # the owl row makes two
    models = [job.model for job in result.jobs]
    assert models.count("tiny-wan") == 3 and models.count("tiny-flux") == 4
    owls = [job for job in result.jobs if job.source_id == "flux-owl"]
    assert [job.id for job in owls] == ["flux-owl-0", "flux-owl-1"] and owls[0].seed != owls[1].seed
    assert models.count("tiny-wan-i2v") == 1 and models.count("tiny-flux-kontext") == 1
    assert models.count("tiny-qwen-image-edit") == 1 and models.count("tiny-ltx2") == 1
    assert models.count("tiny-z-image") == 1 and models.count("tiny-qwen-image-21") == 1
    assert models.count("tiny-flux2") == 1 and models.count("tiny-flux2-klein") == 1
    assert models.count("tiny-hunyuan-video-15") == 1 and models.count("tiny-hunyuan-video-15-i2v") == 1
    started = [job for job in result.jobs if job.image is not None]
    assert [job.model for job in started] == ["tiny-wan-i2v", "tiny-flux-kontext", "tiny-qwen-image-edit",
                                              "tiny-qwen-image-21", "tiny-hunyuan-video-15-i2v"]
    assert {job.image for job in started} == {str(EXAMPLES / "images" / "lighthouse.png")}  # relative to the manifest
    assert result.extra_columns == ["category", "priority"]
    assert all(job.width * job.height <= 64 * 64 for job in result.jobs)  # small enough for a CPU
    validate = ["validate", str(EXAMPLES / "manifest.parquet")]
    assert CliRunner().invoke(main, [*validate, "--model", "tiny-wan"]).exit_code == 0  # as `make demo` runs it
    without = CliRunner().invoke(main, validate)  # its video rows name no model: the run must
    assert without.exit_code == 2 and "3 of 16 rows have no `model` value" in without.output


def test_the_few_step_example_is_what_its_script_writes_and_runs_its_lora_at_4_steps_without_cfg(tmp_path):
    spec = importlib.util.spec_from_file_location("few_step", EXAMPLES / "make_few_step_manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = EXAMPLES / "few_step_wan.parquet"
    assert pq.read_table(module.main(str(tmp_path / "f.parquet"))).equals(pq.read_table(shipped))
    result = read_jobs(str(shipped), overrides=JobOverrides(model="tiny-wan"))
    assert not result.rejected and len(result.jobs) == 6
    fast = [job for job in result.jobs if job.lora]
    assert len(fast) == 4 and {(job.num_inference_steps, job.guidance_scale) for job in fast} == {(4, 1.0)}
    (ref,) = fast[0].lora
    assert ref.is_hub_id and ref.weight_name.endswith(".safetensors")
    base = [job for job in result.jobs if not job.lora]
    assert {(job.num_inference_steps, job.guidance_scale) for job in base} == {(50, 5.0)}
    assert {job.seed for job in base} <= {job.seed for job in fast}  # each base row pairs with a fast one
