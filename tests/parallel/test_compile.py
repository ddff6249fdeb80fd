"""`--compile`: each repeated block's forward compiled in place, at step 4 of the parallelisation order.

With the `aot_eager` backend (dynamo and AOTAutograd tracing, no code generation: what graph breaks and
recompiles depend on) the compiled denoiser must give the eager latents (within 1e-4; aot_eager runs the
same kernels, so they are in fact equal), one graph per block class (per kind of block: SD3's last block,
`context_pre_only`, is its own), no graph break under one process, Ulysses, CFG and FSDP; under Ring the
P2P exchange breaks the graph and runs eagerly outside it. Mixed sizes compile at most twice per block
class, and every compile is a `compile` timing row whose seconds the step rows leave out.
"""

from __future__ import annotations

import pytest
import torch

from genbatch.models import family, resolve_model
from genbatch.parallel.compile import CLOCK, CompileConfig, unit_names
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.distributed import run_on_ranks
from tests.support.runs import job, job_executor

PRESETS = ("tiny-wan", "tiny-flux", "tiny-sd3")


def _denoise(out: str, preset: str, compile: bool, jobs=None, **layout) -> dict:
    """Eager or compiled (aot_eager) final latents of `jobs` (one default job), with dynamo's counters."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    CLOCK.counts.clear()
    CLOCK.take()
    latents, rows = [], []
    with job_executor(out, compile=compile, compile_backend="aot_eager", **layout) as (world, executor):
        for spec in jobs or [job(preset, num_inference_steps=2)]:
            timer = JobTimer(world.ctx.device)
            latents.append(drive.denoise(executor, spec, timer))
            rows += timer.rows()
    return {"latents": latents, "rows": rows, "graph_breaks": sum(counters["graph_break"].values()),
            "graphs": counters["stats"]["unique_graphs"], "compiles": dict(CLOCK.counts)}


def _compare(out: str, preset: str, **layout) -> dict:
    eager = _denoise(out, preset, False, **layout)
    compiled = _denoise(out, preset, True, **layout)
    diff = max(float((a - b).abs().max()) for a, b in zip(eager["latents"], compiled["latents"]))
    return {"diff": diff, **{key: compiled[key] for key in ("rows", "graph_breaks", "graphs", "compiles")}}


def test_compile_units_are_each_repeated_block_of_every_family():
    from genbatch.runner.presets import build_preset

    for preset in (*PRESETS, "tiny-qwen-image", "tiny-hunyuan-video"):
        model = build_preset(preset, meta=("transformer",)).transformer
        plan = family(resolve_model(preset).family).transformer_parts(type(model).__name__)
        blocks = [f"{path}.{index}" for path in plan.blocks.repeated
                  for index in range(len(model.get_submodule(path)))]
        assert unit_names(model, plan.compile_units) == blocks, preset


def test_a_compile_mode_without_inductor_is_refused():
    with pytest.raises(ValueError, match="--compile-backend inductor"):
        CompileConfig(backend="aot_eager", mode="max-autotune")
    with pytest.raises(ValueError, match="is not one of"):
        CompileConfig(backend="tensorrt")


@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_denoiser_equals_eager_in_one_process_without_graph_breaks(preset, tmp_path):
    result = _compare(str(tmp_path), preset)
    assert result["diff"] <= 1e-4
    assert result["graph_breaks"] == 0
    assert result["graphs"] == sum(result["compiles"].values()) <= 2  # one graph per kind of block, reused
    compiles = [row for row in result["rows"] if row["stage"] == "compile"]
    assert len(compiles) == result["graphs"] and all(row["unit"] and row["shape"] for row in compiles)
    steps = [row for row in result["rows"] if row["stage"] == "denoise_step"]
    assert compiles[0]["step"] == steps[0]["step"] == 0
    # the first step ran the compiles; its row leaves them out, so it is no longer than the compiles
    assert steps[0]["seconds"] < sum(row["seconds"] for row in compiles)


def _ulysses_two(rank: int, world_size: int, out: str) -> dict:
    return {preset: _compare(f"{out}/{rank}/{preset}", preset, ulysses=2) for preset in PRESETS}


def test_compiled_equals_eager_under_ulysses_2_with_the_all_to_alls_in_the_graph(tmp_path):
    for rank, results in enumerate(run_on_ranks(_ulysses_two, world_size=2, args=(str(tmp_path),), timeout_s=240)):
        for preset, result in results.items():
            assert result["diff"] <= 1e-4, (rank, preset, result["diff"])
            assert result["graph_breaks"] == 0, (rank, preset)
            assert result["graphs"] <= 2, (rank, preset)


def _ring_two(rank: int, world_size: int, out: str) -> dict:
    return _compare(f"{out}/{rank}", "tiny-wan", ring=2)


def test_ring_exchange_runs_eagerly_between_compiled_graphs(tmp_path):
    for rank, result in enumerate(run_on_ranks(_ring_two, world_size=2, args=(str(tmp_path),), timeout_s=240)):
        assert result["diff"] <= 1e-4, rank
        assert result["graph_breaks"] > 0, rank  # the P2P exchange is outside the graphs, run eagerly


def _cfg_ulysses_fsdp(rank: int, world_size: int, out: str) -> dict:
    return _compare(f"{out}/{rank}", "tiny-wan", cfg=2, ulysses=2, fsdp=True)


def test_compiled_equals_eager_under_cfg_2_ulysses_2_with_fsdp(tmp_path):
    for rank, result in enumerate(run_on_ranks(_cfg_ulysses_fsdp, world_size=4, args=(str(tmp_path),),
                                               timeout_s=280)):
        assert result["diff"] <= 1e-4, rank
        assert result["graph_breaks"] == 0, rank
        assert result["compiles"] == {"WanTransformerBlock": 1}, rank


def _mixed_size_jobs() -> list:
    """Three resolutions x two frame counts: six sequence lengths (some of them uneven over two ranks)."""
    return [job("tiny-wan", id=f"{width}x{height}x{frames}", width=width, height=height, num_frames=frames,
                num_inference_steps=1)
            for width, height in ((64, 48), (48, 32), (80, 64)) for frames in (5, 9)]


def test_mixed_sizes_compile_at_most_twice_per_block_class(tmp_path):
    result = _denoise(str(tmp_path), "tiny-wan", True, jobs=_mixed_size_jobs())
    assert result["graph_breaks"] == 0
    assert 1 <= result["compiles"]["WanTransformerBlock"] <= 2
    compiles = [row for row in result["rows"] if row["stage"] == "compile"]
    assert len(compiles) == result["compiles"]["WanTransformerBlock"]
    assert len({row["shape"] for row in compiles}) == len(compiles)  # each written with the shape it met


def _mixed_sizes_ulysses_two(rank: int, world_size: int, out: str) -> dict:
    result = _denoise(f"{out}/{rank}", "tiny-wan", True, jobs=_mixed_size_jobs(), ulysses=2)
    return {key: result[key] for key in ("graph_breaks", "compiles")}


@pytest.mark.slow  # test_batch_compile.py holds "each size compiles at most once" in make test; here under ulysses
def test_mixed_sizes_under_ulysses_compile_at_most_twice_per_block_class(tmp_path):
    for rank, result in enumerate(run_on_ranks(_mixed_sizes_ulysses_two, world_size=2, args=(str(tmp_path),),
                                               timeout_s=280)):
        assert result["graph_breaks"] == 0, rank
        assert 1 <= result["compiles"]["WanTransformerBlock"] <= 2, (rank, result["compiles"])


# -- the option, end to end ----------------------------------------------------------------------------------


def test_gen_run_compile_writes_compile_rows_also_with_layout_auto(tmp_path):
    import pyarrow.compute as pc

    from genbatch.io import RunStore
    from tests.support.runs import run_cli, write_manifest

    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    for layout in ("manual", "auto"):
        torch._dynamo.reset()
        out = str(tmp_path / layout)
        result = run_cli("run", manifest, "--out", out, "--model", "tiny-wan", "--steps", "2", "--compile",
                         "--compile-backend", "aot_eager", "--layout", layout, "-q")
        assert result.returncode == 0, result.stderr
        timings = RunStore(out).read_timings()
        compiles = timings.filter(pc.equal(timings["stage"], "compile"))
        assert compiles.num_rows == 1 and compiles["unit"].to_pylist() == ["WanTransformerBlock"], layout
        assert RunStore(out).read_run_info()["options"]["compile"] is True


def test_gen_submit_and_gen_bench_pass_compile_to_gen_run(tmp_path):
    from genbatch.benchmark.execute import SuiteRunner
    from genbatch.benchmark.suites import get_suite
    from genbatch.parallel.dims import ParallelDims
    from genbatch.parallel.flags import kernel_args
    from tests.support.runs import run_cli

    result = run_cli("submit", str(tmp_path / "m.parquet"), "--out", str(tmp_path / "run"), "--nodes", "1",
                     "--gpus-per-node", "0", "--procs-per-node", "1", "--compile", "--compile-backend", "aot_eager",
                     "--dry-run")
    assert result.returncode == 0, result.stderr
    command = result.stdout[result.stdout.rindex("genbatch run"):]  # the script's own command, not its comment
    assert "--compile \\\n    --compile-backend aot_eager" in command
    assert kernel_args(True) == ["--compile"] and kernel_args(False, "aot_eager") == []
    runner = SuiteRunner(suite=get_suite("tiny"), manifest_url="m", model_dir="d", out="o",
                         run_args=tuple(kernel_args(True, "eager")))
    assert runner.command(ParallelDims())[-3:] == ["--compile", "--compile-backend", "eager"]
    assert "--compile-backend" in run_cli("bench", "--help").stdout


@pytest.mark.slow  # inductor's own compile (aot_eager covers the graph in make test); make test-slow runs it
def test_inductor_compiled_wan_equals_eager_within_1e_4_and_its_artifacts_reload(tmp_path, monkeypatch):
    """The suite's one inductor compile (generated C++ kernels: reassociated sums, so not bitwise); its
    artifacts, saved, then unpacked into another empty inductor cache after dynamo forgets everything,
    compile to the same latents."""
    from genbatch.runner.compile_cache import CompileCache

    latents = {}
    for name, compile in (("eager", False), ("cold", True), ("warm", True)):
        torch._dynamo.reset()
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / f"inductor-{name}"))
        cache = CompileCache(url=str(tmp_path / "cache"), name="wan.tar.gz")
        if name == "warm":
            assert cache.load() and any((tmp_path / "inductor-warm").rglob("*.so"))
        with job_executor(str(tmp_path), compile=compile, compile_backend="inductor") as (world, executor):
            latents[name] = drive.denoise(executor, job("tiny-wan", num_inference_steps=2), JobTimer(world.ctx.device))
        if name == "cold":
            assert cache.save() and (tmp_path / "cache" / "wan.tar.gz").stat().st_size > 0
    assert float((latents["cold"] - latents["eager"]).abs().max()) <= 1e-4
    assert torch.equal(latents["warm"], latents["cold"])


def test_gen_run_keeps_compiled_artifacts_for_the_next_run(tmp_path, monkeypatch):
    """The run writes what torch hands it under --compile-cache (rank 0, at the end), and the next run loads
    it before compiling (aot_eager makes no artifacts, so torch's two calls are stood in for)."""
    from tests.support.runs import run_cli, write_manifest

    loaded = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", loaded.append)
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    for out in ("first", "second"):
        torch._dynamo.reset()
        result = run_cli("run", manifest, "--out", str(tmp_path / out), "--model", "tiny-wan", "--steps", "1",
                         "--compile", "--compile-backend", "aot_eager", "--compile-cache", str(tmp_path / "cc"), "-q")
        assert result.returncode == 0, result.stderr
    files = list((tmp_path / "cc").iterdir())
    assert [f.name for f in files] == [f"torch-{torch.__version__}-aot_eager-float32-cpu-single.tar.gz"]
    assert loaded == [b"artifacts"]  # the archive's mega-cache member


def test_a_compile_cache_that_cannot_be_written_does_not_fail_the_run(tmp_path, monkeypatch):
    from tests.support.runs import run_cli, write_manifest

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    (tmp_path / "not-a-folder").write_text("a file where the cache folder should be")
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a fox"}])
    torch._dynamo.reset()
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-wan", "--steps", "1",
                     "--compile", "--compile-backend", "aot_eager", "--compile-cache", str(tmp_path / "not-a-folder"),
                     "-q")
    assert result.returncode == 0, result.stderr
    assert "the compiled artifacts were not kept" in result.stderr
