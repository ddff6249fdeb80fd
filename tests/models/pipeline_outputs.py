"""Helpers for the family tests: a job's frames through genbatch's executor, and the same job through the
diffusers pipeline's own `__call__`, so a test can compare the two by `tests/runner/test_equivalence.py`'s
criteria."""

from __future__ import annotations

import numpy as np
import torch

from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.runs import job_executor


def random_image(path, size: tuple[int, int]) -> str:
    """A PNG of random pixels, `size` (width, height), written to `path` (the same pixels for the same size)."""
    from PIL import Image

    pixels = np.random.default_rng(sum(size)).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path)


def saved_preset(name: str, directory) -> str:
    """The preset `name` written to `directory` with save_pretrained (loaded back through from_pretrained)."""
    pipe = load_pipeline(resolve_model(name), torch.device("cpu"), torch.float32)
    pipe.save_pretrained(directory)
    return str(directory)


def genbatch_frames(model: str, spec_job, out: str) -> np.ndarray:
    with job_executor(out, model=model) as (world, executor):
        return drive.generate(executor, spec_job, JobTimer(world.ctx.device))


def pipeline_frames(model: str, spec_job, **call) -> np.ndarray:
    """The pipeline's output for the job's prompt, sizes, steps and seed, plus the call arguments `call`."""
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    output = pipe(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width,
                  num_inference_steps=spec_job.num_inference_steps,
                  generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np", **call)
    return output.frames[0] if spec_job.num_frames is not None else output.images[0]


def _stale_latents(rank, world_size, cases, out):
    """The final latents of each (job, layout, stale config) of `cases` on this rank."""
    results = []
    for index, (spec_job, layout, stale) in enumerate(cases):
        with job_executor(f"{out}/{index}/rank{rank}", **layout) as (world, executor):
            drive.use_stale(executor, stale)
            results.append(drive.denoise(executor, spec_job, JobTimer(world.ctx.device)))
    return results


def assert_stale_methods_run_it(spec_job, tmp_path) -> None:
    """PipeFusion 2 and DistriFusion 2 run an edit row (its input's tokens in the image stream) as they run a text
    row, held to their text rows' checks (`tests/parallel/test_pipefusion.py`, `test_distrifusion.py`): with the
    warm-up over every step the latents equal one process's within 1e-5 on every rank; with one warm-up step
    both ranks hold one latent, and it errs (MSE against exact) more than 0 and at most half as much as naive
    patches on the same layout, each patch attending only to itself (its share of the noise's rows and of the
    input's)."""
    assert_stale_methods_run_them([spec_job], tmp_path)


def assert_stale_methods_run_them(jobs, tmp_path) -> None:
    """`assert_stale_methods_run_it` for each of `jobs` (of different models), in one pool call."""
    from genbatch.parallel.stale import DISTRIFUSION, NAIVE_PATCH, PIPEFUSION, StaleConfig
    from tests.support.distributed import run_on_ranks

    cases = []
    for spec_job in jobs:
        steps = spec_job.num_inference_steps
        for layout, method in (({"pp": 2}, PIPEFUSION), ({"distrifusion": 2}, DISTRIFUSION)):
            cases += [(spec_job, layout, StaleConfig(method=method, patches=2, warmup_steps=steps)),
                      (spec_job, layout, StaleConfig(method=method, patches=2, warmup_steps=1)),
                      (spec_job, layout, StaleConfig(method=NAIVE_PATCH, patches=2, warmup_steps=1))]
    per_rank = run_on_ranks(_stale_latents, 2, args=(cases, str(tmp_path / "ranks")), timeout_s=60 + 30 * len(jobs))
    exact = {spec_job.model: _stale_latents(0, 1, [(spec_job, {}, None)], str(tmp_path / f"one-{index}"))[0]
             for index, spec_job in enumerate(jobs)}
    for first in range(0, len(cases), 3):
        spec_job, _, config = cases[first]
        name = f"{spec_job.model} {config.method}"
        for latents in per_rank:
            diff = (latents[first] - exact[spec_job.model]).abs().max().item()
            assert diff <= 1e-5, f"{name} warmed up over every step: latents differ by {diff}"
        assert all(torch.equal(latents[first + 1], per_rank[0][first + 1]) for latents in per_rank), name
        stale, naive = (float((per_rank[0][index] - exact[spec_job.model]).pow(2).mean())
                        for index in (first + 1, first + 2))
        print(name, {"stale": stale, "naive": naive})
        assert 0 < stale <= 0.5 * naive, (name, stale, naive)


def assert_stale_methods_run_it_end_to_end(preset: str, image: str, tmp_path) -> None:
    """`gen run --pipefusion 2` and `--distrifusion 2` of an edit row of `preset` write the image, the results row
    naming the approximation it ran under."""
    import pyarrow.parquet as pq

    from tests.support.runs import run_cli_on_ranks, write_manifest

    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "edit", "prompt": "a red boat", "model": preset,
                                                             "image": image, "num_inference_steps": 2,
                                                             "width": 48, "height": 32}])
    for flag, label in (("--pipefusion", "pipefusion(patches=2,warmup=1)"),
                        ("--distrifusion", "distrifusion(patches=2,warmup=1)")):
        out = tmp_path / flag.strip("-")
        result = run_cli_on_ranks(2, "run", manifest, "--out", str(out), flag, "2", "--warmup-steps", "1", "-q")
        assert result.returncode == 0, result.stderr[-3000:]
        (row,) = pq.read_table(out / "results").to_pylist()
        assert (row["status"], row["attention_approximation"]) == ("done", label), row


def check_two_rank_layouts(spec_job, layouts, tmp_path, timeout_s: float = 90) -> None:
    """`spec_job` under each of `layouts` ((dp, cfg, ring, ulysses, fsdp[, tp]) on two gloo ranks) equals one
    process's run of it, by `tests/parallel/test_layouts.py`'s criteria."""
    check_two_rank_cases([(spec_job, *layout) for layout in layouts], tmp_path, timeout_s)


def check_two_rank_cases(cases, tmp_path, timeout_s: float = 90) -> None:
    """Each of `cases` ((job, dp, cfg, ring, ulysses, fsdp[, tp]), jobs of different models) on two gloo ranks, all
    in one pool call, equals one process's run of its job, by `tests/parallel/test_layouts.py`'s criteria."""
    from tests.parallel.test_layouts import _all_layouts, _check, _run_job
    from tests.support.distributed import run_on_ranks

    per_rank = run_on_ranks(_all_layouts, 2, args=(cases, str(tmp_path / "ranks")), timeout_s=timeout_s)
    jobs = {case[0].model: case[0] for case in cases}
    assert len({id(case[0]) for case in cases}) == len(jobs), "one job per model: the references are by model"
    _check(cases, per_rank, {model: _run_job(spec_job, None, 1, 1, 1, False, out=str(tmp_path / f"one-{index}"))
                             for index, (model, spec_job) in enumerate(jobs.items())})


def assert_a_row_without_an_image_is_rejected(preset: str, tmp_path, prompt: str = "a red boat") -> None:
    """A manifest of an image row and a row without one: the second is rejected alone, naming `image` and why."""
    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests import read_jobs
    from tests.support.runs import write_manifest

    rows = [{"id": "with-image", "prompt": prompt, "model": preset, "image": "in.png"},
            {"id": "no-image", "prompt": prompt, "model": preset}]
    result = read_jobs(write_manifest(str(tmp_path / "m.parquet"), rows), overrides=JobOverrides(),
                       check_media=False)
    assert [spec_job.id for spec_job in result.jobs] == ["with-image"]
    (rejection,) = result.rejected
    assert (rejection.job_id, rejection.column) == ("no-image", "image")
    assert f"{preset} starts from an image, and the row names none; fill `image`" in rejection.reason
