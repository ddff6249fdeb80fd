"""Pure parts: layout names, metric definitions, the step clock, the model cache, the suites."""

from __future__ import annotations

import os

import pytest
import torch

from genbatch.benchmark.layouts import layout_name, multi_device_layouts, parse_layout, parse_layouts, run_args
from genbatch.benchmark.metrics import layout_metrics, report_metrics
from genbatch.benchmark.models import MODELS, WAN21_1_3B_TRANSFORMER, materialize
from genbatch.benchmark.stepclock import StepClock
from genbatch.benchmark.suites import SUITES, get_suite
from genbatch.parallel.dims import ParallelDims


def test_layout_names_round_trip_and_flags():
    for layout in (ParallelDims(), ParallelDims(dp=2), ParallelDims(cfg=2, ulysses=2), ParallelDims(ring=2, fsdp=True),
                   ParallelDims(dp=2, cfg=2, ring=2, ulysses=2, fsdp=True)):
        assert parse_layout(layout_name(layout)) == layout
    assert layout_name(ParallelDims(cfg=2, ulysses=2)) == "cfg2-ulysses2" and layout_name(ParallelDims()) == "single"
    assert run_args(ParallelDims(ulysses=2)) == ["--dp", "1", "--cfg", "1", "--distrifusion", "1", "--pp", "1",
                                                 "--ring", "1", "--ulysses", "2", "--tp", "1", "--no-fsdp",
                                                 "--nproc", "2"]
    assert "--nproc" not in run_args(ParallelDims(fsdp=True))
    assert parse_layouts("single, dp2,single") == [ParallelDims(), ParallelDims(dp=2)]
    for bad in ("dp0", "ulysses", "sp2", "dp2-dp2"):
        with pytest.raises(ValueError, match="e.g. single, dp2"):
            parse_layout(bad)
    assert parse_layout("pp2") == ParallelDims(pp=2)
    assert run_args(parse_layout("ulysses2-tp2"))[-5:] == ["--tp", "2", "--no-fsdp", "--nproc", "4"]
    with pytest.raises(ValueError, match="names no layout"):
        parse_layouts(" , ")


def test_multi_device_layouts_use_every_device_legally():
    assert multi_device_layouts(1, 12, uses_cfg=True) == [ParallelDims()]
    names = [layout_name(layout) for layout in multi_device_layouts(8, 12, uses_cfg=True)]
    assert names == ["single", "dp8", "ring8", "cfg2-ulysses4"]  # no ulysses8: 8 does not divide 12 heads
    names = [layout_name(layout) for layout in multi_device_layouts(4, 12, uses_cfg=True)]
    assert names == ["single", "dp4", "ulysses4", "ring4", "cfg2-ulysses2"]
    assert all(layout.world_size in (1, 4) for layout in multi_device_layouts(4, 12, uses_cfg=False))


def _row(job, rank, stage, step, start, seconds, **extra):
    return {"job_id": job, "rank": rank, "stage": stage, "step": step, "start": start, "seconds": seconds, **extra}


def test_metrics_count_the_slowest_rank_and_the_whole_span():
    rows = []
    for job, offset in (("a", 0.0), ("b", 10.0)):
        rows.append(_row(job, 0, "text_encode", None, offset, 1.0))
        for step in range(2):
            for rank, seconds in ((0, 1.0), (1, 2.0 + step)):  # rank 1 is the slow one
                rows.append(_row(job, rank, "denoise_step", step, offset + 1 + step * 3, seconds, bytes_all_to_all=100))
        rows.append(_row(job, 0, "vae_decode", None, offset + 7, 2.0, peak_bytes=5))
        rows.append(_row(job, 1, "vae_decode", None, offset + 7, 1.0, peak_bytes=9))
    metrics = layout_metrics(rows, "ulysses2", 2)
    assert metrics.jobs == 2
    assert metrics.step_seconds == [2.0, 3.0]
    assert metrics.seconds_per_step == 2.5
    assert metrics.stage_seconds == {"text_encode": 1.0, "denoise": 5.0, "vae_decode": 2.0}
    assert metrics.jobs_per_hour == pytest.approx(3600 * 2 / 19.0)  # first start 0, last end 17 + 2
    assert metrics.bytes_per_step == 100 and metrics.peak_decode_bytes == 9
    with pytest.raises(ValueError, match="no timed denoising steps"):
        layout_metrics([_row("a", 0, "text_encode", None, 0.0, 1.0)], "dp2", 2)


def test_efficiency_is_against_single():
    import pyarrow as pa

    def rows(layout, world, seconds):
        return [{**_row(job, 0, "denoise_step", 0, index * seconds, seconds), "layout": layout, "world": world}
                for index, job in enumerate(("a", "b"))]

    table = pa.Table.from_pylist(rows("single", 1, 2.0) + [
        {**row, "start": 0.0} for row in rows("dp2", 2, 2.0)])  # dp2: both jobs at once
    metrics = report_metrics(table)
    assert metrics["single"].efficiency == 1.0
    assert metrics["dp2"].efficiency == pytest.approx(1.0)  # twice the jobs per hour on twice the processes
    assert metrics["dp2"].step_speedup == 1.0


class _Tiny(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_step_clock_splits_calls_into_steps():
    model = _Tiny()
    with StepClock(device=torch.device("cpu"), module_class=_Tiny) as clock:
        for _ in range(2 * 3 * 2):  # 2 jobs x 3 steps x 2 branches
            model(torch.ones(1))
            torch.nn.Linear(1, 1)(torch.ones(1))  # other modules are not counted
    assert len(clock.marks) == 12
    periods = clock.step_periods(jobs=2, steps=3)
    assert len(periods) == 4 and all(p > 0 for p in periods)
    model(torch.ones(1))  # hooks are gone after the block
    assert len(clock.marks) == 12
    with pytest.raises(ValueError, match="do not split"):
        clock.step_periods(jobs=5, steps=1)


def test_model_cache_builds_once(tmp_path):
    first = materialize(MODELS["tiny-wan"], str(tmp_path))
    stamp = os.path.getmtime(os.path.join(first, "model_index.json"))
    assert materialize(MODELS["tiny-wan"], str(tmp_path)) == first
    assert os.path.getmtime(os.path.join(first, "model_index.json")) == stamp
    assert os.listdir(tmp_path) == [os.path.basename(first)]  # no temp folders left behind


def test_gpu_suite_model_is_the_published_architecture():
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        transformer = WanTransformer3DModel(**WAN21_1_3B_TRANSFORMER)
    parameters = sum(p.numel() for p in transformer.parameters())
    assert 1.40e9 < parameters < 1.43e9  # Wan2.1-T2V-1.3B: 1.42B
    gpu = get_suite("gpu")
    assert (gpu.width, gpu.height, gpu.num_frames, gpu.num_inference_steps) == (832, 480, 33, 10)
    with pytest.raises(ValueError, match="choose one of tiny, cpu, gpu"):
        get_suite("nightly")


def test_suites_manifests_are_valid():
    from genbatch.models import preset_names, resolve_model

    for suite in SUITES.values():
        # a preset's own spec; the other models share their family's tiny preset's geometry (FLUX.1-dev
        # tiny-flux's, the Wan architectures tiny-wan's)
        family_preset = "tiny-flux" if suite.model.name.startswith("flux") else "tiny-wan"
        spec = resolve_model(suite.model.name if suite.model.name in preset_names() else family_preset)
        rows = suite.manifest_rows()
        assert len({row["id"] for row in rows}) == len(rows) == suite.jobs
        assert len({row["seed"] for row in rows}) == suite.jobs
        row = rows[0]
        assert ("num_frames" in row) == spec.is_video
        assert spec.geometry_problems(row["width"], row["height"], row.get("num_frames")) == []
        for layout in suite.layouts:
            assert suite.model.num_heads % layout.ulysses == 0
