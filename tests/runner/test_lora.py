"""LoRA per row: a job with adapters equals the diffusers pipeline with the same adapters loaded by its own
`load_lora_weights` (the diffusers/peft layout; the converted ones: the original Wan `diffusion_model.*`
layout, kohya's FLUX layout with its CLIP layers, the ComfyUI Qwen-Image layout; a text-encoder LoRA; two
adapters at two scales), each scale as diffusers' adapter weight. A job without one after it gets the base
weights back bit for bit, and A, none, B, none in one run equals four separate runs. Under ulysses, --tp,
--fsdp and PipeFusion each rank merges only its own part (its elements counted) and equals one process; under
--compile a switch compiles nothing. End to end, `gen run` applies each row's adapters, records them with their
sha256, groups the hand-out by adapter set, resolves hub ids (a `weight_name` file alone), and rejects or fails
the bad ones alone (a pickle, a file outside the manifest's directory, another architecture, a pickle under a
.safetensors name), never showing their bytes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from genbatch.jobs.lora import LoraRef, run_loras
from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.support import executor as drive
from tests.support.lora import kohya_flux_lora, peft_lora, qwen_comfy_lora, wan_original_lora
from tests.support.runs import job, job_executor, run_cli, write_manifest

FLUX_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "proj_out", "proj_mlp", "net.0.proj")
"""Column-wise, row-wise and packed row-wise (the single blocks' proj_out) Linears under --tp."""
SECRET = b"SECRET-ADAPTER-BYTES"


@pytest.fixture(scope="module")
def flux_lora(tmp_path_factory):
    return peft_lora("tiny-flux", tmp_path_factory.mktemp("flux-lora"), FLUX_TARGETS)


def _pipeline_output(spec_job, lora: str | None = None, scale: float = 1.0) -> np.ndarray:
    pipe = load_pipeline(resolve_model(spec_job.model), torch.device("cpu"), torch.float32)
    if lora is not None:
        pipe.load_lora_weights(lora, adapter_name="row")
        pipe.set_adapters("row", scale)
    call = dict(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width,
                num_inference_steps=spec_job.num_inference_steps, guidance_scale=spec_job.guidance_scale,
                generator=torch.Generator("cpu").manual_seed(spec_job.seed), output_type="np")
    if spec_job.num_frames is not None:
        return pipe(num_frames=spec_job.num_frames, **call).frames[0]
    return pipe(**call).images[0]


def test_a_lora_job_equals_diffusers_and_the_next_job_gets_the_base_weights_back(flux_lora, tmp_path):
    plain = job("tiny-flux", num_inference_steps=3, seed=5)
    styled, half = (replace(plain, lora=(LoraRef(flux_lora, scale=scale),)) for scale in (1.0, 0.5))
    with job_executor(str(tmp_path / "out")) as (world, executor):
        timer = JobTimer(world.ctx.device)
        ours = {name: drive.generate(executor, spec, timer) for name, spec in
                (("styled", styled), ("plain", plain), ("half", half), ("styled again", styled))}
        weights = executor.adapters._weights[executor.model_for(plain).pipe]
        kept = weights.kept_bytes
    switches = [row for row in timer.rows() if row["stage"] == "lora_switch"]
    assert len(switches) == 4  # on, off, another scale, back
    reference = _pipeline_output(plain)
    np.testing.assert_array_equal(ours["plain"], reference)  # the base weights, bit for bit
    for name, scale in (("styled", 1.0), ("half", 0.5)):
        theirs = _pipeline_output(plain, flux_lora, scale)
        assert np.abs(ours[name] - theirs).max() <= 1e-4, name
        assert np.abs(theirs - reference).max() > 0.05, "the adapter must move the output"
    np.testing.assert_array_equal(ours["styled again"], ours["styled"])
    assert 0 < kept < sum(p.numel() * 4 for p in load_pipeline(resolve_model("tiny-flux"), torch.device("cpu"),
                                                                 torch.float32).transformer.parameters())


def test_a_none_b_none_in_one_run_equals_four_separate_runs(flux_lora, tmp_path):
    other = peft_lora("tiny-flux", tmp_path / "other", ("to_k", "proj_mlp", "ff.net.2"), seed=7)
    plain = job("tiny-flux", num_inference_steps=2, seed=8)
    sequence = [replace(plain, lora=(LoraRef(flux_lora),)), plain, replace(plain, lora=(LoraRef(other, 0.7),)), plain]
    with job_executor(str(tmp_path / "one")) as (world, executor):
        together = [drive.generate(executor, spec, JobTimer(world.ctx.device)) for spec in sequence]
    for index, spec in enumerate(sequence):
        with job_executor(str(tmp_path / f"alone-{index}")) as (world, executor):
            np.testing.assert_array_equal(together[index], drive.generate(executor, spec, JobTimer(world.ctx.device)))
    assert np.abs(together[0] - together[1]).max() > 0.05 and np.abs(together[2] - together[1]).max() > 0.05


def test_the_original_wan_layout_is_converted_as_diffusers_converts_it(tmp_path):
    lora = wan_original_lora(tmp_path / "wan" / "lightx2v_style.safetensors")
    spec = job("tiny-wan", num_inference_steps=3, seed=5, num_frames=5)
    with job_executor(str(tmp_path / "out")) as (world, executor):
        ours = drive.generate(executor, replace(spec, lora=(LoraRef(lora, scale=0.7),)), JobTimer(world.ctx.device))
    theirs = _pipeline_output(spec, lora, 0.7)
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(theirs - _pipeline_output(spec)).max() > 0.05


def test_the_comfyui_qwen_image_layout_is_converted_as_diffusers_converts_it(tmp_path):
    lora = qwen_comfy_lora(tmp_path / "qwen" / "lightning_style.safetensors", alpha=16.0)
    spec = job("tiny-qwen-image", num_inference_steps=2, seed=5)
    with job_executor(str(tmp_path / "out")) as (world, executor):
        ours = drive.generate(executor, replace(spec, lora=(LoraRef(lora, scale=0.7),)), JobTimer(world.ctx.device))
        base = drive.generate(executor, spec, JobTimer(world.ctx.device))
    theirs = _two_adapter_output(spec, [(lora, 0.7)])
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(theirs - base).max() > 0.01  # the adapter moved it (100x the tolerance)


def test_kohya_flux_and_text_encoder_loras_equal_diffusers(tmp_path):
    """kohya's sd-scripts FLUX layout (packed qkv split by diffusers, CLIP layers under lora_te1_) and a
    diffusers-layout text-encoder LoRA: each equals the pipeline with its own load_lora_weights, and each
    changes the text encoder's weights, which the job after it gets back."""
    kohya = kohya_flux_lora(tmp_path / "kohya" / "flux_style.safetensors")
    encoder = peft_lora("tiny-flux", tmp_path / "clip", ("q_proj", "v_proj", "fc1"), component="text_encoder", seed=3)
    spec = job("tiny-flux", num_inference_steps=2, seed=6)
    with job_executor(str(tmp_path / "out")) as (world, executor):
        pipe = executor.model_for(spec).pipe
        base = {name: param.clone() for name, param in pipe.text_encoder.named_parameters()}
        ours = {}
        for name, path, scale in (("kohya", kohya, 0.8), ("encoder", encoder, 1.0)):
            ours[name] = drive.generate(executor, replace(spec, lora=(LoraRef(path, scale=scale),)),
                                           JobTimer(world.ctx.device))
            changed = [key for key, param in pipe.text_encoder.named_parameters() if not torch.equal(param, base[key])]
            assert changed, f"{name}: the text encoder's layers were not merged"
        plain = drive.generate(executor, spec, JobTimer(world.ctx.device))
        assert all(torch.equal(param, base[key]) for key, param in pipe.text_encoder.named_parameters())
    reference = _pipeline_output(spec)
    np.testing.assert_array_equal(plain, reference)
    for name, path, scale in (("kohya", kohya, 0.8), ("encoder", encoder, 1.0)):
        theirs = _pipeline_output(spec, path, scale)
        assert np.abs(ours[name] - theirs).max() <= 1e-4, name
        assert np.abs(theirs - reference).max() > 0.05, f"{name}: the adapter must move the output"


def test_a_changed_adapter_or_scale_restarts_a_checkpointed_job():
    from genbatch.jobs.prepared import PreparedJob
    from genbatch.runner.execute import fingerprint

    styled = PreparedJob.of(replace(job("tiny-flux"), lora=(LoraRef("/a/style.safetensors"),)), lora_sha256=("1" * 64,))
    assert fingerprint(styled) != fingerprint(PreparedJob.of(styled, lora_sha256=("2" * 64,)))
    assert fingerprint(styled) != fingerprint(replace(styled, lora=(LoraRef("/a/style.safetensors", 0.5),)))
    assert "lora" not in fingerprint(PreparedJob.of(job("tiny-flux")))  # a job without adapters keeps its old fingerprint


def test_run_level_loras_pair_each_scale_by_order(tmp_path):
    first, second = run_loras(("a/b", "./x.safetensors"), (0.5,))
    assert (first.uri, first.scale, second.scale) == ("a/b", 0.5, 1.0)
    assert second.uri == os.path.join(os.getcwd(), "x.safetensors")
    with pytest.raises(ValueError, match="one scale per adapter"):
        run_loras(("a/b",), (0.5, 0.7))
    from genbatch.runner.download import manifest_adapter_ids

    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "a", "prompt": "p", "lora": [{"uri": "org/x@v1"}, {"uri": "./a.safetensors"}]},
        {"id": "b", "prompt": "p", "lora": [{"uri": "org/y", "scale": 2.0},
                                            {"uri": "org/many", "weight_name": "loras/fast_4step.safetensors"}]},
        {"id": "c", "prompt": "p"}])
    # downloaded with the models; one of a repository of many files is that file alone
    assert [(hub.name, hub.files) for hub in manifest_adapter_ids(manifest)] == [
        ("org/many", ("loras/fast_4step.safetensors",)), ("org/x@v1", ()), ("org/y", ())]


def _layouts_on_rank(rank, world_size, styled, plain, layouts, out):
    from genbatch.parallel.stale import PIPEFUSION, StaleConfig

    results = []
    for index, layout in enumerate(layouts):
        layout = dict(layout)
        stale = StaleConfig(method=PIPEFUSION, patches=2, warmup_steps=styled.num_inference_steps) \
            if layout.get("pp") else None
        with job_executor(f"{out}/{index}", **layout) as (world, executor):
            drive.use_stale(executor, stale)
            latents = [drive.denoise(executor, styled, JobTimer(world.ctx.device))]
            elements = executor.adapters._weights[executor.model_for(styled).pipe].elements
            latents.append(drive.denoise(executor, plain, JobTimer(world.ctx.device)))
        results.append((latents, elements))
    return results


def test_sharded_layouts_merge_their_own_parts_and_equal_one_process(flux_lora, tmp_path):
    from tests.support.distributed import run_on_ranks

    plain = job("tiny-flux", num_inference_steps=2, seed=9)
    styled = replace(plain, lora=(LoraRef(flux_lora, scale=0.8),))
    with job_executor(str(tmp_path / "one")) as (world, executor):
        reference = [drive.denoise(executor, spec, JobTimer(world.ctx.device)) for spec in (styled, plain)]
        drive.denoise(executor, styled, JobTimer(world.ctx.device))
        whole = executor.adapters._weights[executor.model_for(styled).pipe].elements
    layouts = [{"ulysses": 2}, {"tp": 2}, {"ulysses": 2, "fsdp": True}, {"pp": 2}]
    per_rank = run_on_ranks(_layouts_on_rank, 2, args=(styled, plain, layouts, str(tmp_path / "ranks")),
                            timeout_s=90)
    assert (reference[0] - reference[1]).abs().max() > 1e-2
    # each rank merges its own part only (about half of the set's delta elements: a top-level layer kept whole
    # is merged on both ranks under tp and PipeFusion), and together the ranks merge all of it
    for index, layout in enumerate(layouts):
        counts = [results[index][1] for results in per_rank]
        if layout == {"ulysses": 2}:
            assert counts == [whole, whole]  # the weights are whole on each rank, and so is their delta
            continue
        assert all(0 < count <= 0.55 * whole for count in counts) and sum(counts) >= whole, (layout, counts, whole)
        if layout.get("fsdp"):
            assert sum(counts) == whole, (layout, counts, whole)  # FSDP shards every weight: nothing twice
    for rank, results in enumerate(per_rank):
        for layout, (latents, _) in zip(layouts, results, strict=True):
            for name, ours, theirs in zip(("styled", "plain"), latents, reference, strict=True):
                diff = (ours - theirs).abs().max().item()
                # 1e-5 of the latents' scale: the x40 adapter takes them to about 50
                assert diff <= 1e-5 * max(1.0, theirs.abs().max().item()), f"{layout} rank {rank} {name}: {diff}"


def test_gen_run_applies_records_groups_and_refuses_bad_adapters_alone(flux_lora, tmp_path):
    from safetensors.torch import save_file

    root = tmp_path / "batch"
    loras = root / "loras"
    loras.mkdir(parents=True)
    shutil.copytree(flux_lora, loras / "style")  # a copy: a symlink out of the manifest's directory is refused
    (loras / "evil.bin").write_bytes(SECRET * 8)
    torch.save({"weight": torch.zeros(2), "note": SECRET.decode()}, loras / "disguised.safetensors")
    alien = peft_lora("tiny-sd3", tmp_path / "sd3-lora", ("to_q",))
    shutil.copy(os.path.join(alien, "pytorch_lora_weights.safetensors"), loras / "sd3.safetensors")
    from safetensors.torch import load_file

    widened = load_file(os.path.join(flux_lora, "pytorch_lora_weights.safetensors"))
    first = sorted(key for key in widened if key.endswith("lora_A.weight"))[0]
    widened[first] = torch.zeros(widened[first].shape[0], widened[first].shape[1] * 2)
    save_file(widened, loras / "widened.safetensors")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file({"x": torch.zeros(1)}, outside / "secret.safetensors")
    style = [{"uri": "./loras/style"}]
    rows = [
        {"id": "styled-a", "lora": style, "seed": 1},
        {"id": "plain-a", "seed": 2},
        {"id": "half", "lora": [{"uri": "./loras/style", "scale": 0.5}], "seed": 3},
        {"id": "styled-b", "lora": style, "seed": 4},
        {"id": "plain-b", "lora": [], "seed": 5},
        {"id": "pickled", "lora": [{"uri": "loras/evil.bin"}], "seed": 6},
        {"id": "outside", "lora": [{"uri": str(outside / "secret.safetensors")}], "seed": 7},
        {"id": "alien", "lora": [{"uri": "loras/sd3.safetensors"}], "seed": 8},
        {"id": "disguised", "lora": [{"uri": "loras/disguised.safetensors"}], "seed": 9},
        {"id": "widened", "lora": [{"uri": "loras/widened.safetensors"}], "seed": 10},
    ]
    manifest = write_manifest(str(root / "manifest.parquet"), [{"prompt": "a lighthouse at dusk", **row} for row in rows])
    out = str(tmp_path / "out")
    result = run_cli("run", manifest, "--out", out, "--model", "tiny-flux", "--steps", "2", "-q")
    assert result.returncode == 1, result.stderr[-3000:]
    table = pq.read_table(os.path.join(out, "results")).to_pylist()
    by_id = {row["id"]: row for row in table}
    assert {name: row["status"] for name, row in by_id.items()} == {
        "styled-a": "done", "plain-a": "done", "half": "done", "styled-b": "done", "plain-b": "done",
        "pickled": "rejected", "outside": "rejected", "alien": "failed", "disguised": "failed",
        "widened": "failed"}
    rejected = {row["id"]: row for row in pq.read_table(os.path.join(out, "rejected")).to_pylist()}
    assert rejected["pickled"]["column"] == "lora" and "convert it to safetensors" in rejected["pickled"]["reason"]
    assert rejected["outside"]["column"] == "lora" and "--media-allow" in rejected["outside"]["reason"]
    assert "1 of its layers match no module of tiny-flux (first: transformer.transformer_blocks.1.attn.to_q)" \
        in by_id["alien"]["error"], by_id["alien"]["error"]
    assert "is for another architecture than tiny-flux" in by_id["widened"]["error"], by_id["widened"]["error"]
    assert first.removesuffix(".lora_A.weight") in by_id["widened"]["error"]
    assert all("use a LoRA trained for tiny-flux" in by_id[name]["error"] for name in ("alien", "widened"))
    assert "not a safetensors file" in by_id["disguised"]["error"], by_id["disguised"]["error"]
    recorded = json.loads(by_id["styled-a"]["lora"])
    assert recorded[0]["uri"] == str(loras / "style") and recorded[0]["scale"] == 1.0
    assert len(recorded[0]["sha256"]) == 64
    assert by_id["plain-a"]["lora"] is None and by_id["plain-b"]["lora"] is None
    # the hand-out puts each adapter set's jobs together (style at 1.0, none, style at 0.5; the bad ones fail
    # before any switch): one switch per change of set, none between styled-a and styled-b
    timings = pq.read_table(os.path.join(out, "timings")).to_pylist()
    switches = [row["job_id"] for row in timings if row["stage"] == "lora_switch"]
    assert switches == ["styled-a", "plain-a", "half"], switches
    everything = result.stdout + result.stderr
    for root_dir, _, files in os.walk(out):
        for name in files:
            with open(os.path.join(root_dir, name), "rb") as handle:
                assert SECRET not in handle.read(), name
    assert SECRET.decode() not in everything


def test_a_hub_id_adapter_resolves_from_the_hub_cache_as_models_do(flux_lora, tmp_path, monkeypatch):
    from tests.support.hub import add_snapshot

    cache = str(tmp_path / "hub")
    add_snapshot(cache, "org/style", flux_lora, "c" * 40)
    many = tmp_path / "many"  # a repository of many files: the row names its LoRA by weight_name
    (many / "loras").mkdir(parents=True)
    shutil.copy(os.path.join(flux_lora, "pytorch_lora_weights.safetensors"), many / "loras" / "fast.safetensors")
    shutil.copy(os.path.join(flux_lora, "pytorch_lora_weights.safetensors"), many / "loras" / "other.safetensors")
    add_snapshot(cache, "org/many", str(many), "d" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "hub", "prompt": "a lighthouse", "seed": 1},
        {"id": "named", "prompt": "a lighthouse", "seed": 1,
         "lora": [{"uri": "org/many", "weight_name": "loras/fast.safetensors", "scale": 0.5}]}])
    out = tmp_path / "out"
    result = run_cli("run", manifest, "--out", str(out), "--model", "tiny-flux", "--steps", "2", "-q",
                     "--lora", "org/style", "--lora-scale", "0.5", "--no-download")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    with open(os.path.join(flux_lora, "pytorch_lora_weights.safetensors"), "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    for name, uri in (("hub", "org/style"), ("named", "org/many")):
        (recorded,) = json.loads(rows[name]["lora"])
        assert (recorded["uri"], recorded["scale"], recorded["sha256"]) == (uri, 0.5, digest)
    outputs = {name: (out / "outputs" / f"{name}.png").read_bytes() for name in rows}
    assert outputs["hub"] == outputs["named"]  # the same adapter, scale and seed
    options = json.loads((out / "run.json").read_text())["overrides"]
    assert options["lora"] == [{"uri": "org/style", "scale": 0.5, "weight_name": None}]


def test_a_hub_adapter_with_a_weight_name_downloads_that_file_alone(tmp_path, monkeypatch):
    from genbatch.jobs.lora import adapter_hub_id
    from genbatch.runner.download import ModelFetch

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    fetched = []
    failures = ModelFetch(allowed=True, fetch=fetched.append, quiet=True).run(
        names=lambda: ["org/model", adapter_hub_id("org/many", "loras/fast.safetensors"), "org/model"],
        store=None, key="k", rank=0, local_rank=0, world_size=1)
    assert failures == {}
    assert [(hub.repo, hub.files) for hub in fetched] == [("org/model", ()), ("org/many", ("loras/fast.safetensors",))]
    assert fetched[1].fill_command() == "hf download org/many loras/fast.safetensors"


def test_under_compile_a_switch_changes_tensors_in_place_and_compiles_nothing(flux_lora, tmp_path):
    from torch._dynamo.utils import counters

    from genbatch.parallel.compile import CLOCK

    plain = job("tiny-flux", num_inference_steps=2, seed=3)
    styled = replace(plain, lora=(LoraRef(flux_lora),))
    with job_executor(str(tmp_path / "eager")) as (world, executor):
        eager = [drive.denoise(executor, spec, JobTimer(world.ctx.device)) for spec in (styled, plain)]
    torch._dynamo.reset()
    counters.clear()
    CLOCK.counts.clear()
    with job_executor(str(tmp_path / "compiled"), compile=True, compile_backend="aot_eager") as (world, executor):
        first = drive.denoise(executor, plain, JobTimer(world.ctx.device))
        graphs = counters["stats"]["unique_graphs"]
        compiled = [drive.denoise(executor, spec, JobTimer(world.ctx.device)) for spec in (styled, plain, styled)]
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs  # three switches, no new graph
    for ours, theirs in zip(compiled, (eager[0], eager[1], eager[0]), strict=True):
        assert (ours - theirs).abs().max().item() <= 1e-4 * max(1.0, theirs.abs().max().item())
    assert (first - eager[1]).abs().max().item() <= 1e-4


def _two_adapter_output(spec_job, adapters) -> np.ndarray:
    pipe = load_pipeline(resolve_model(spec_job.model), torch.device("cpu"), torch.float32)
    for index, (path, _) in enumerate(adapters):
        pipe.load_lora_weights(path, adapter_name=f"a{index}")
    pipe.set_adapters([f"a{index}" for index in range(len(adapters))], [scale for _, scale in adapters])
    kwargs = {"true_cfg_scale": spec_job.guidance_scale} if spec_job.model == "tiny-qwen-image" else \
        {"guidance_scale": spec_job.guidance_scale}
    return pipe(prompt=spec_job.prompt, height=spec_job.height, width=spec_job.width,
                num_inference_steps=spec_job.num_inference_steps, output_type="np",
                generator=torch.Generator("cpu").manual_seed(spec_job.seed), **kwargs).images[0]


@pytest.mark.parametrize("preset", ["tiny-sd3", "tiny-qwen-image"])
def test_two_adapters_at_two_scales_equal_diffusers(preset, tmp_path):
    adapters = [(peft_lora(preset, tmp_path / "a", ("to_q", "to_v"), seed=1), 0.6),
                (peft_lora(preset, tmp_path / "b", ("to_k", "to_out.0"), rank=2, alpha=2.0, seed=2), 1.3)]
    spec = job(preset, num_inference_steps=2, seed=4, lora=tuple(LoraRef(path, scale) for path, scale in adapters))
    with job_executor(str(tmp_path / "out")) as (world, executor):
        ours = drive.generate(executor, spec, JobTimer(world.ctx.device))
        base = drive.generate(executor, replace(spec, lora=()), JobTimer(world.ctx.device))
    theirs = _two_adapter_output(spec, adapters)
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(ours - base).max() > 0.01  # the adapters moved it (100x the tolerance)


def test_wan_2_2_adapters_go_into_the_expert_each_names(tmp_path):
    from PIL import Image

    from tests.support.executor import RowNotPrepared

    image = tmp_path / "first.png"
    Image.new("RGB", (64, 48), (250, 240, 20)).save(image)
    high = wan_original_lora(tmp_path / "w22" / "high_noise.safetensors", "tiny-wan22-i2v", seed=1)
    low = wan_original_lora(tmp_path / "w22" / "low_noise.safetensors", "tiny-wan22-i2v", seed=2)
    spec = job("tiny-wan22-i2v", num_inference_steps=3, seed=21, num_frames=5, image=str(image), negative_prompt="grey")
    refs = (LoraRef(high, 0.8, expert="high"), LoraRef(low, 0.6, expert="low"))
    with job_executor(str(tmp_path / "out"), model="tiny-wan22-i2v") as (world, executor):
        pipe = executor.model_for(spec).pipe
        base = {name: param.clone() for name, param in pipe.transformer_2.named_parameters()}
        ours = drive.generate(executor, replace(spec, lora=refs), JobTimer(world.ctx.device))
        assert any(not torch.equal(param, base[name]) for name, param in pipe.transformer_2.named_parameters())
        only_high = drive.generate(executor, replace(spec, lora=refs[:1]), JobTimer(world.ctx.device))
        assert all(torch.equal(param, base[name]) for name, param in pipe.transformer_2.named_parameters())
    reference = load_pipeline(resolve_model("tiny-wan22-i2v"), torch.device("cpu"), torch.float32)
    reference.load_lora_weights(high, adapter_name="high")
    reference.load_lora_weights(low, adapter_name="low", load_into_transformer_2=True)
    reference.set_adapters(["high", "low"], [0.8, 0.6])
    theirs = reference(prompt=spec.prompt, negative_prompt="grey", image=Image.open(image), height=spec.height,
                       width=spec.width, num_frames=5, num_inference_steps=3, guidance_scale=spec.guidance_scale,
                       generator=torch.Generator("cpu").manual_seed(21), output_type="np").frames[0]
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(ours - only_high).max() > 0.01  # the low-noise expert's adapter moved it (100x the tolerance)
    with job_executor(str(tmp_path / "one"), model="tiny-wan") as (world, executor):
        with pytest.raises(RowNotPrepared, match="column 'lora': .*expert 'low' is the transformer_2 of a two-expert"):
            drive.generate(executor, replace(job("tiny-wan", num_frames=5, num_inference_steps=2),
                                      lora=(LoraRef(low, expert="low"),)), JobTimer(world.ctx.device))


def test_the_expert_field_is_read_recorded_and_refused_when_unknown(tmp_path):
    from genbatch.jobs.lora import from_text, lora_text
    from genbatch.jobs.spec import JobOverrides
    from genbatch.manifests import read_jobs

    manifest = write_manifest(str(tmp_path / "m.parquet"), [
        {"id": "low", "prompt": "p", "lora": [{"uri": "org/w22", "weight_name": "low_noise.safetensors", "expert": "low"}]},
        {"id": "mid", "prompt": "p", "lora": [{"uri": "org/w22", "expert": "mid"}]}])
    result = read_jobs(manifest, overrides=JobOverrides(model="tiny-wan"))
    (ref,) = result.jobs[0].lora
    assert (ref.expert, ref.component) == ("low", "transformer_2")
    assert from_text(lora_text((ref,))) == (ref,)
    assert lora_text((LoraRef("org/x"),)) == '[{"uri":"org/x","scale":1.0,"weight_name":null}]'  # as before experts
    (rejected,) = result.rejected
    assert rejected.job_id == "mid" and rejected.column == "lora" and "expert 'mid'" in rejected.reason
    assert "'high', 'low'" in rejected.reason
