"""PSNR and SSIM in NumPy: exact values on known cases, 1 / inf for identical inputs, lower for worse copies;
gen bench with a cache mode scores it against the exact run, in the report, its quality plot and the verdict."""

import math

import numpy as np
import pytest

from genbatch.benchmark.quality import psnr, ssim


def test_psnr_of_known_errors():
    image = np.random.default_rng(0).integers(0, 250, (16, 16, 3)).astype(np.uint8)
    assert psnr(image, image, 255) == math.inf
    assert psnr(image + 1, image, 255) == pytest.approx(20 * math.log10(255))  # MSE 1


def test_ssim_is_one_for_equal_inputs_and_falls_with_noise():
    rng = np.random.default_rng(1)
    video = rng.random((2, 24, 24, 3))
    assert ssim(video, video, 1.0) == pytest.approx(1.0)
    slight, strong = video + 0.02 * rng.standard_normal(video.shape), video + 0.3 * rng.standard_normal(video.shape)
    assert 1.0 > ssim(slight, video, 1.0) > ssim(strong, video, 1.0) > 0.0
    assert ssim(video * 0.5 + 0.25, video, 1.0) < 1.0  # contrast change
    with pytest.raises(ValueError, match="at least 7"):
        ssim(video[:, :4], video[:, :4], 1.0)


def test_only_a_psnr_drop_past_one_db_regresses():
    from genbatch.benchmark.quality import quality_regressed

    assert quality_regressed("psnr_db", 40.0, 38.9) and not quality_regressed("psnr_db", 40.0, 39.1)
    assert not quality_regressed("ssim", 0.99, 0.5)  # reported, never a verdict


@pytest.mark.slow  # gen bench end to end, twice (20 s): the metrics themselves are tested above
def test_gen_bench_scores_a_cache_against_the_exact_run_and_judges_the_drop(tmp_path):
    import json

    import pyarrow.parquet as pq

    from genbatch.benchmark.quality import PSNR_CAP_DB
    from tests.support.runs import run_cli

    models = str(tmp_path / "models")
    exact = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", str(tmp_path / "a"),
                    "--model-cache", models, "--cache", "fbc:0")
    assert exact.returncode == 0, exact.stderr
    assert json.loads((tmp_path / "a" / "quality.json").read_text())["single"]["psnr_db"] == PSNR_CAP_DB
    # the cached night runs its two rows as one batch: its cache decides per batch, scored as any cache is
    cached = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", str(tmp_path / "b"),
                     "--model-cache", models, "--cache", "fbc:0.5", "--baseline", str(tmp_path / "a"),
                     "--batch-size", "2")
    scores = json.loads((tmp_path / "b" / "quality.json").read_text())["single"]
    assert scores["psnr_db"] < PSNR_CAP_DB - 1 and 0 < scores["ssim"] < 1 and scores["jobs"] == 2
    assert cached.returncode == 3  # the quality regression fails the night like a slower step would
    assert "psnr_db" in cached.stderr and "REGRESSION" in cached.stderr
    report = (tmp_path / "b" / "report.md").read_text()
    assert "## Quality against the exact configuration" in report and "](plots/quality.png)" in report
    assert "batches of 2 rows, step cache fbc:0.5" in report
    results = pq.read_table(tmp_path / "b" / "exact" / "runs" / "single" / "results").to_pylist()
    assert {row["batch_size"] for row in results} == {2}  # the exact run batches the same rows
    cached_rows = pq.read_table(tmp_path / "b" / "runs" / "single" / "results").to_pylist()
    assert {row["batch_id"] for row in cached_rows} == {row["batch_id"] for row in results}
    _assert_quality_plot(tmp_path / "b" / "plots" / "quality.png")


def _assert_quality_plot(path) -> None:
    """A drawn PNG (bars and labels, not a blank canvas)."""
    from PIL import Image

    image = Image.open(path)
    image.load()
    assert image.format == "PNG" and image.width >= 600
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 10


def test_the_quality_plot_is_drawn_for_the_scored_layouts(tmp_path):
    from genbatch.benchmark.plots import quality_png

    (tmp_path / "q.png").write_bytes(quality_png({"single": {"psnr_db": 41.5, "ssim": 0.97},
                                                  "ulysses2": {"psnr_db": 38.0, "ssim": 0.91}}, "fbc:0.1"))
    _assert_quality_plot(tmp_path / "q.png")


def test_stale_layouts_take_the_warm_up_flags_and_exact_ones_do_not():
    from genbatch.benchmark.execute import SuiteRunner
    from genbatch.benchmark.suites import SUITES
    from genbatch.parallel.dims import ParallelDims

    runner = SuiteRunner(suite=SUITES["tiny"], manifest_url="m", model_dir="d", out="o",
                         stale_args=("--warmup-steps", "2", "--patches", "4"))

    def tail(layout):
        command = runner.command(layout)
        return command[command.index("-q"):]

    assert "--warmup-steps" not in tail(ParallelDims(ulysses=2))  # gen run refuses it for an exact layout
    assert tail(ParallelDims(pp=2))[-4:] == ["--warmup-steps", "2", "--patches", "4"]
    assert tail(ParallelDims(distrifusion=2))[-2:] == ["--warmup-steps", "2"]  # no --patches: PipeFusion's


@pytest.mark.slow  # gen bench end to end: two layouts and the exact run
def test_gen_bench_scores_stale_layouts_against_an_exact_one(tmp_path):
    import json

    from tests.support.runs import run_cli

    result = run_cli("bench", "--suite", "tiny", "--layouts", "single,pp2", "--out", str(tmp_path / "a"),
                     "--model-cache", str(tmp_path / "models"), "--warmup-steps", "1")
    assert result.returncode == 0, result.stderr
    quality = json.loads((tmp_path / "a" / "quality.json").read_text())
    assert list(quality) == ["pp2"] and quality["pp2"]["jobs"] == 2 and 0 < quality["pp2"]["ssim"] <= 1


@pytest.mark.slow  # two gen bench runs, as the cache and stale-layout nights above
def test_a_few_step_night_runs_the_lora_and_scores_it_against_the_base_model(tiny_report, tmp_path):
    import json

    import pyarrow.parquet as pq

    from genbatch.benchmark.quality import PSNR_CAP_DB
    from tests.support.lora import wan_original_lora
    from tests.support.runs import run_cli

    lora = wan_original_lora(tmp_path / "loras" / "wan_2step.safetensors")
    out = tmp_path / "night"
    result = run_cli("bench", "--suite", "tiny", "--layouts", "single", "--out", str(out),
                     "--model-cache", tiny_report.model_cache, "--lora", lora, "--lora-scale", "0.5",
                     "--lora-steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads((out / "quality.json").read_text())["single"]
    assert scores["psnr_db"] < PSNR_CAP_DB - 1 and 0 < scores["ssim"] < 1 and scores["jobs"] == 2
    steps = {}
    for run in ("runs/single", "exact/runs/single"):
        for row in pq.read_table(out / run / "timings").to_pylist():
            if row["stage"] == "denoise_step":
                steps.setdefault(run, {}).setdefault(row["job_id"], set()).add(row["step"])
    assert {len(done) for done in steps["runs/single"].values()} == {2}  # the recipe's steps
    assert {len(done) for done in steps["exact/runs/single"].values()} == {4}  # the base model's own
    (recorded,) = {row["lora"] for row in pq.read_table(out / "runs" / "single" / "results").to_pylist()}
    assert [(item["uri"], item["scale"]) for item in json.loads(recorded)] == [(lora, 0.5)]
    assert all(row["lora"] is None for row in pq.read_table(out / "exact" / "runs" / "single" / "results").to_pylist())
    report = (out / "report.md").read_text()
    assert "## Quality against the base model's full-step output" in report
    assert "2 steps, guidance 1: a different (distilled) model from the base, not a cache" in report
    assert "2 steps, guidance 1.0" in report  # the work line: what the layouts ran


def test_few_step_flags_need_their_lora():
    from tests.support.runs import run_cli

    result = run_cli("bench", "--suite", "tiny", "--out", "/tmp/never", "--lora-steps", "4")
    assert result.returncode == 2 and "pass --lora URI" in result.stderr, result.stderr


def test_a_few_step_recipe_sets_each_rows_steps_and_guidance_and_its_report_says_what_it_is():
    import json

    from genbatch.benchmark.markdown import render
    from genbatch.benchmark.metrics import LayoutMetrics
    from genbatch.benchmark.recipe import FewStepRecipe
    from genbatch.jobs.lora import LoraRef

    recipe = FewStepRecipe(lora=(LoraRef("/loras/fast/wan_4step.safetensors", 0.8), LoraRef("org/style")))
    rows = recipe.rows([{"id": "a", "num_inference_steps": 50, "guidance_scale": 5.0, "seed": 1}])
    assert rows == [{"id": "a", "num_inference_steps": 4, "guidance_scale": 1.0, "seed": 1}]
    assert recipe.run_args() == ("--lora", "/loras/fast/wan_4step.safetensors", "--lora-scale", "0.8",
                                 "--lora", "org/style", "--lora-scale", "1.0", "--media-allow", "/loras/fast")
    with pytest.raises(ValueError, match="pass --lora URI"):
        FewStepRecipe(lora=())
    metrics = {"single": LayoutMetrics(layout="single", world=1, jobs=2, seconds_per_step=0.1, step_seconds=[0.1],
                                       stage_seconds={}, jobs_per_hour=10.0, bytes_per_step=0.0,
                                       extra={"psnr_db": 21.5, "ssim": 0.71, "jobs": 2})}
    info = {"suite": "tiny", "created": "now", "model": "tiny-wan", "model_detail": "tiny", "dtype": "fp32",
            "manifest": {"jobs": 2, "width": 64, "height": 48, "num_frames": 9, "num_inference_steps": 4,
                         "guidance_scale": 1.0},
            "host": "h", "cpus": 2, "accelerators": "no GPU", "load_average": 0.0, "versions": {},
            "recipe": recipe.describe(50, 5.0)}
    report = render(info, metrics, None, {})
    assert "not a cache; scored against the base model's own 50-step output at guidance 5" in report
    assert "## Quality against the base model's full-step output" in report and "21.50" in report
    assert "## Quality against the exact configuration" not in report
    json.dumps(info)  # summary.json keeps it
