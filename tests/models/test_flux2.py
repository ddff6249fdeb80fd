"""FLUX.2 [dev] (`tiny-flux2`) and [klein] (`tiny-flux2-klein`, distilled; `tiny-flux2-klein-base`, CFG).

- A job's output equals the pipeline's own `__call__` (identical pixels) at two sizes of two aspect ratios, from the
  preset and from a saved directory, and with a reference image (another aspect than the output's; its tokens
  follow the noise's); the prompt, [dev]'s guidance and a base model's CFG move the output, a distilled [klein]
  ignores the guidance as its pipeline does.
- Every layout equals one process: ulysses 2, ring 2, tp 2 (the packed column splits), FSDP, cfg 2 for the base
  model's two branches, and PipeFusion 2 and DistriFusion 2 hold their exactness and error bounds; the Mistral 3
  and Qwen3 text encoders split over a job group (`--text-encoder-parallel tp`) encode as one process.
- The VAE (`AutoencoderKLFlux2`) decodes and encodes patch-parallel as one rank at 2 and 4 ranks.
- A diffusers-format LoRA equals `load_lora_weights` + `fuse_lora`, also merged into tp and FSDP shards.
- Batches (`--batch-size`), the step caches and `--compile` run it as they run FLUX.1; the hub ids resolve.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from genbatch.jobs.lora import LoraRef
from genbatch.models import resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import (
    assert_stale_methods_run_them,
    check_two_rank_cases,
    genbatch_frames,
    pipeline_frames,
    random_image,
    saved_preset,
)
from tests.support.distributed import run_on_ranks
from tests.support.lora import peft_lora
from tests.support.runs import job, job_executor
from tests.support import executor as drive

DEV, KLEIN, BASE = "tiny-flux2", "tiny-flux2-klein", "tiny-flux2-klein-base"
LORA_TARGETS = ("to_q", "add_v_proj", "to_out.0", "to_add_out", "linear_in", "linear_out", "to_qkv_mlp_proj",
                "single_transformer_blocks.0.attn.to_out")
"""Column-wise, row-wise, packed column-wise ([gate, up]; [q, k, v, gate, up]) and packed row-wise Linears."""


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2")
    return {preset: saved_preset(preset, root / preset) for preset in (DEV, KLEIN, BASE)}


@pytest.mark.parametrize("preset", [DEV, KLEIN])
def test_the_family_data_names_real_modules(preset):
    """The blocks, attention sites, split points, tensor styles, text encoder blocks and VAE rules of the family
    name the preset's real modules; the VAE decodes and encodes tile-parallel."""
    import fnmatch

    from genbatch.models import family
    from genbatch.parallel.compile import _matches
    from genbatch.parallel.vae.encode import unsupported_encode_reason
    from genbatch.parallel.vae.forwards import unsupported_reason
    from genbatch.runner.presets import build_preset

    pipe = build_preset(preset)
    record = family(resolve_model(preset).family)
    plan = record.transformer_parts(type(pipe.transformer).__name__)
    children = dict(pipe.transformer.named_children())
    assert all(name in children for name in (*plan.blocks.before, *plan.blocks.repeated, *plan.blocks.after))
    names = [name for name, _ in pipe.transformer.named_modules()]
    for site in plan.attention:
        assert any(fnmatch.fnmatchcase(name, site.pattern) for name in names), site.pattern
    for pattern in plan.tensor_splits.styles:
        assert any(_matches(name, pattern) for name in names), pattern
    assert set(plan.list_carried) <= set(plan.blocks.repeated) and set(plan.cache_lists) <= set(plan.blocks.repeated)
    encoder = pipe.text_encoder
    blocks = record.text_encoders[type(encoder).__name__]
    assert all(isinstance(encoder.get_submodule(path), torch.nn.ModuleList) for path in blocks.repeated)
    assert unsupported_reason(pipe.vae) is None and unsupported_encode_reason(pipe.vae) is None


def _equal(model, spec_job, tmp_path, **call):
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(model, spec_job, guidance_scale=spec_job.guidance_scale, **call)
    assert ours.shape == theirs.shape == (spec_job.height, spec_job.width, 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01  # a real image, not a constant
    return ours


SLOW = pytest.mark.slow  # the other two pairings of model and size: the two above hold both sizes and both sources
EQUALITY_CASES = [pytest.param(preset, size, from_directory, id=f"{name}-{preset}", marks=marks)
                  for size, from_directory, name, slow_preset in [((64, 64), False, "64x64-preset", BASE),
                                                                   ((48, 80), True, "48x80-directory", DEV)]
                  for preset in (DEV, BASE) for marks in [(SLOW,) if preset == slow_preset else ()]]


@pytest.mark.parametrize(("preset", "size", "from_directory"), EQUALITY_CASES)
def test_output_equals_the_diffusers_pipeline(preset, size, from_directory, directories, tmp_path):
    model = directories[preset] if from_directory else preset
    spec_job = job(preset, model=model, seed=3, width=size[0], height=size[1], num_inference_steps=2,
                   guidance_scale=3.5)
    _equal(model, spec_job, tmp_path)


@pytest.mark.parametrize("preset", [DEV, KLEIN])
def test_a_reference_image_row_equals_the_pipeline(preset, tmp_path):
    # a 96 x 72 input of another aspect than the 64 x 48 output: cut to 96 x 64, its tokens after the noise's
    image = random_image(tmp_path / "in.png", (96, 72))
    spec_job = job(preset, seed=4, width=64, height=48, num_inference_steps=2, image=image)
    ours = _equal(preset, spec_job, tmp_path, image=Image.open(image))
    without = genbatch_frames(preset, job(preset, seed=4, width=64, height=48, num_inference_steps=2),
                              str(tmp_path / "plain"))
    assert np.abs(ours - without).max() > 0.02, "the image must move the output (5 levels at least)"


@pytest.mark.slow  # the equality with Flux2Pipeline above holds the prompt and the guidance in make test
def test_the_prompt_and_the_guidance_reach_the_image(tmp_path):
    """Two prompts differ, as do two guidance values of [dev] and of the base model (CFG); the distilled [klein]
    ignores the guidance, as its pipeline does."""
    def frames(preset, **fields):
        with job_executor(str(tmp_path / preset)) as (world, executor):
            return drive.generate(executor, job(preset, seed=6, num_inference_steps=2, **fields), JobTimer(world.ctx.device))

    for preset in (DEV, BASE):
        base = frames(preset, prompt="a red boat", guidance_scale=4.0)
        assert np.abs(base - frames(preset, prompt="a snowy mountain village", guidance_scale=4.0)).max() > 0.02
        assert np.abs(base - frames(preset, prompt="a red boat", guidance_scale=2.0)).max() > 0.02, preset
    np.testing.assert_array_equal(frames(KLEIN, guidance_scale=1.0), frames(KLEIN, guidance_scale=4.0))


def test_sequence_tensor_fsdp_and_cfg_layouts_equal_one_process(tmp_path):
    """On two ranks, in one pool call: [dev] with a reference image (15 noise tokens and 24 of the image's: 39 in
    the image stream, uneven, after 512 text tokens) under ulysses 2, ring 2, tp 2 and ulysses 2 with FSDP; the base
    model's two branches under cfg 2."""
    image = random_image(tmp_path / "in.png", (96, 72))
    dev = job(DEV, width=80, height=48, num_inference_steps=2, seed=17, image=image)
    base = job(BASE, width=64, height=48, num_inference_steps=2, seed=18, guidance_scale=4.0)
    check_two_rank_cases([(dev, 1, 1, 1, 2, False), (dev, 1, 1, 2, 1, False), (dev, 1, 1, 1, 1, False, 2),
                          (dev, 1, 1, 1, 2, True), (base, 1, 2, 1, 1, False)], tmp_path, timeout_s=120)


@pytest.mark.slow
def test_the_rest_of_the_layouts_equal_one_process_and_merge_a_lora_into_their_shards(tmp_path):
    """The base model under cfg 2 with FSDP and ulysses 2; the distilled [klein] with
    a LoRA (every kind of split Linear) merged into tp 2 shards and FSDP shards."""
    lora = peft_lora(KLEIN, tmp_path / "lora", LORA_TARGETS)
    base = job(BASE, width=64, height=48, num_inference_steps=2, seed=18, guidance_scale=4.0)
    klein = job(KLEIN, width=64, height=48, num_inference_steps=2, seed=19, lora=(LoraRef(lora, scale=0.8),))
    check_two_rank_cases([(base, 1, 2, 1, 1, True), (base, 1, 1, 1, 2, False),
                          (klein, 1, 1, 1, 1, False, 2), (klein, 1, 1, 1, 2, True)], tmp_path, timeout_s=180)


def _encodes_split(rank, world_size, jobs, out):
    """Each job's prompt encode with the text encoder split over the two ranks (`--text-encoder-parallel tp`)."""
    from torch.distributed.tensor import DTensor

    results = []
    for index, spec_job in enumerate(jobs):
        with job_executor(f"{out}/{index}", ulysses=2, text_encoder_parallel="tp") as (world, executor):
            model = executor.model_for(spec_job)
            assert any(isinstance(param, DTensor) for param in model.pipe.text_encoder.parameters())
            encoded = model.family_hooks.encode(model.pipe, spec_job, world.ctx.device)
            results.append({name: branch["encoder_hidden_states"] for name, branch in encoded.branches.items()})
    return results


@pytest.mark.slow
def test_the_text_encoders_split_over_a_job_group_encode_as_one_process(tmp_path):
    """Mistral 3 and Qwen3 split by heads and MLP columns over two ranks (`decoder_tensor_splits`; the published
    Mistral 3, 5120 wide, and Qwen3-8B, 4096, split this way under `--text-encoder-parallel auto`)."""
    jobs = [job(DEV, seed=1), job(BASE, seed=1, guidance_scale=4.0)]
    per_rank = run_on_ranks(_encodes_split, 2, args=(jobs, str(tmp_path / "ranks")), timeout_s=120)
    for index, spec_job in enumerate(jobs):
        model = load_pipeline(resolve_model(spec_job.model), torch.device("cpu"), torch.float32)
        from genbatch.models import family

        whole = family(resolve_model(spec_job.model).family).hooks.encode(model, spec_job, torch.device("cpu"))
        for rank, results in enumerate(per_rank):
            assert results[index].keys() == whole.branches.keys()
            for name, embeds in results[index].items():
                diff = (embeds - whole.branches[name]["encoder_hidden_states"]).abs().max().item()
                assert diff <= 1e-4 * whole.branches[name]["encoder_hidden_states"].abs().max().item(), (rank, diff)


@pytest.mark.slow
def test_pipefusion_and_distrifusion_run_it_as_they_run_flux(tmp_path):
    """PipeFusion 2 cuts [dev]'s three blocks inside the single-stream list (its stages hand on the one joined
    [text, image] tensor) and [klein]'s four between the lists (the dual-stream stage sends its two streams joined);
    DistriFusion 2 splits both streams. [dev]'s row carries a reference image (each patch holds a share of the
    noise's rows and of the image's): exact over the warm-up, at most half naive patches' error after it."""
    image = random_image(tmp_path / "in.png", (64, 64))
    assert_stale_methods_run_them([job(DEV, width=64, height=48, num_inference_steps=4, seed=17, image=image),
                                   job(KLEIN, width=64, height=64, num_inference_steps=4, seed=19)], tmp_path)


WIDE_VAE = dict(block_out_channels=[32, 64, 64, 64], latent_channels=8, norm_num_groups=32)
"""AutoencoderKLFlux2 with real 32-group GroupNorm (1 and 2 channels per group)."""
VAE_CASES = (("tiny", (1, 4, 7, 6)), ("wide", (2, 8, 13, 5)))
"""(config, latent): heights that do not divide by the group, a batch of two, 2-D tiles at 4 ranks."""


def _vae_cases(rank, world_size):
    """Per case: max |patch-parallel decode - one-rank decode| on the leader (None elsewhere), the same for the
    tile-parallel encode (a reference image's, `parallel_encoding`) of the decoded image, and the halo bytes."""
    import torch.distributed as dist
    from diffusers import AutoencoderKLFlux2

    from genbatch.models.flux2_tiny import TINY_VAE
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_decode
    from genbatch.parallel.vae.encode import parallel_encode

    results = []
    for config, latent in VAE_CASES:
        torch.manual_seed(0)
        vae = AutoencoderKLFlux2(**(TINY_VAE if config == "tiny" else {**TINY_VAE, **WIDE_VAE})).eval()
        latents = torch.randn(latent, generator=torch.Generator().manual_seed(1))
        comm = Comm(dist.group.WORLD, CommLedger())
        with torch.no_grad():
            whole = vae.decode(latents).sample
            image = parallel_decode(vae, latents, comm)
            encoded = parallel_encode(vae, whole, comm).mode()
            reference = vae.encode(whole).latent_dist.mode()
        results.append(dict(decode=None if image is None else (image - whole).abs().max().item(),
                            encode=(encoded - reference).abs().max().item(), p2p=comm.ledger.take().get("p2p", 0)))
    return results


@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: the tiles' corners too
def test_the_vae_decodes_and_encodes_patch_parallel_as_one_rank(world_size):
    per_rank = run_on_ranks(_vae_cases, world_size, timeout_s=60)
    for index, case in enumerate(VAE_CASES):
        decodes = [ranks[index]["decode"] for ranks in per_rank]
        assert decodes[0] is not None and all(diff is None for diff in decodes[1:]), case  # the leader's image
        assert decodes[0] <= 1e-4, (case, decodes[0])
        assert max(ranks[index]["encode"] for ranks in per_rank) <= 1e-4, case
        assert all(ranks[index]["p2p"] > 0 for ranks in per_rank), case  # halos went between the tiles


@pytest.mark.slow  # tests/runner/test_lora.py holds the adapter path to diffusers (FLUX.1, Wan) in make test
def test_a_lora_equals_diffusers_load_lora_weights_and_fuse_lora(tmp_path):
    lora = peft_lora(DEV, tmp_path / "lora", LORA_TARGETS)
    plain = job(DEV, num_inference_steps=2, seed=5)
    with job_executor(str(tmp_path / "out")) as (world, executor):
        ours = drive.generate(executor, replace(plain, lora=(LoraRef(lora, scale=0.8),)), JobTimer(world.ctx.device))
        base = drive.generate(executor, plain, JobTimer(world.ctx.device))
    pipe = load_pipeline(resolve_model(DEV), torch.device("cpu"), torch.float32)
    pipe.load_lora_weights(lora)
    pipe.fuse_lora(lora_scale=0.8)
    theirs = pipe(prompt=plain.prompt, height=plain.height, width=plain.width, guidance_scale=plain.guidance_scale,
                  num_inference_steps=plain.num_inference_steps, output_type="np",
                  generator=torch.Generator("cpu").manual_seed(plain.seed)).images[0]
    assert np.abs(ours - theirs).max() <= 1e-4
    assert np.abs(ours - base).max() > 0.02, "the adapter must move the output"


@pytest.mark.slow
def test_a_batch_equals_its_rows_alone(tmp_path):
    """Two rows of the base model (CFG) and two of [dev] with reference images of one size, each batch in one
    forward a branch: the latents equal each row's alone (fp32 rounding of the batched GEMMs); images of two sizes
    cannot share a batch."""
    first, second = (random_image(tmp_path / f"in{size}.png", (size, 72)) for size in (96, 97))
    batches = [[job(BASE, id=f"b{seed}", prompt=prompt, seed=seed, guidance_scale=4.0, num_inference_steps=2)
                for seed, prompt in ((1, "a red boat"), (2, "a quiet forest lake"))],
               [job(DEV, id=f"d{seed}", seed=seed, image=image, num_inference_steps=2)
                for seed, image in ((3, first), (4, second))]]
    with job_executor(str(tmp_path / "out")) as (world, executor):
        for rows in batches:
            together = drive.denoise_batch(executor, rows, JobTimer(world.ctx.device))
            for index, row in enumerate(rows):
                alone = drive.denoise(executor, row, JobTimer(world.ctx.device))
                assert (together[index:index + 1] - alone).abs().max().item() <= 1e-4, row.id
        third = random_image(tmp_path / "other.png", (128, 72))  # 128 x 64 after the cut: another latent size
        with pytest.raises(ValueError, match="reference images of different sizes"):
            drive.denoise_batch(executor, [batches[1][0], replace(batches[1][1], image=third)], JobTimer(world.ctx.device))


@pytest.mark.slow
def test_gen_run_batches_rows_and_writes_every_image(tmp_path):
    """`gen run --batch-size 2`: two [dev] rows with reference images of one size batch together, as do two base
    rows (CFG); every image is written, each batch recorded."""
    import pyarrow.parquet as pq

    from genbatch.io import decode_png
    from tests.support.runs import run_cli, write_manifest

    image = random_image(tmp_path / "in.png", (64, 64))
    rows = [{"id": "d1", "prompt": "a red boat", "model": DEV, "image": image, "seed": 1},
            {"id": "d2", "prompt": "a green boat", "model": DEV, "image": image, "seed": 2},
            {"id": "b1", "prompt": "a red boat", "model": BASE, "seed": 3},
            {"id": "b2", "prompt": "a quiet lake", "model": BASE, "seed": 4}]
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{**row, "num_inference_steps": 2} for row in rows])
    out = tmp_path / "out"
    result = run_cli("run", manifest, "--out", str(out), "--batch-size", "2", "--media-allow", "/", "-q")
    assert result.returncode == 0, result.stderr[-3000:]
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert {row["status"] for row in results.values()} == {"done"}
    assert {row["batch_size"] for row in results.values()} == {2}
    assert results["d1"]["batch_id"] == results["d2"]["batch_id"] != results["b1"]["batch_id"]
    for row in rows:
        assert decode_png((out / "outputs" / f"{row['id']}.png").read_bytes()).shape == (64, 64, 3)


@pytest.mark.slow
def test_step_caches_skip_nothing_at_zero_and_skip_at_a_threshold(tmp_path):
    """fbc:0 and taylorseer:1 give the uncached latents bit for bit; fbc:2 and taylorseer:2 skip. First-Block
    Cache spans the single-stream blocks (`cache_lists`), whose outputs agree in shape."""
    with job_executor(str(tmp_path)) as (world, executor):
        for preset in (DEV, BASE):
            def run(cache=None, preset=preset):
                timer = JobTimer(world.ctx.device)
                latents = drive.denoise(executor, job(preset, num_inference_steps=4, cache=cache), timer)
                return latents, [row.get("cache_skipped") for row in timer.rows() if row["stage"] == "denoise_step"]

            exact, _ = run()
            for mode in ("fbc:0", "taylorseer:1"):
                latents, skipped = run(mode)
                assert skipped == [0] * 4 and torch.equal(latents, exact), (preset, mode)
            for mode in ("fbc:2", "taylorseer:2"):  # the tiny random model's residuals change by about 1 a step
                latents, skipped = run(mode)
                assert sum(skipped) > 0 and torch.isfinite(latents).all(), (preset, mode)


@pytest.mark.slow
def test_compile_gives_the_eager_latents(tmp_path):
    """`--compile` (aot_eager: dynamo's tracing, no code generation) compiles each block class once, without a
    graph break, and gives the eager latents."""
    from torch._dynamo.utils import counters

    spec_job = job(DEV, num_inference_steps=2, image=random_image(tmp_path / "in.png", (64, 64)))
    latents = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        counters.clear()
        with job_executor(str(tmp_path / str(compiled)), compile=compiled, compile_backend="aot_eager") as (world, ex):
            latents[compiled] = drive.denoise(ex, spec_job, JobTimer(world.ctx.device))
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 2  # Flux2TransformerBlock, Flux2SingleTransformerBlock
    assert (latents[True] - latents[False]).abs().max().item() <= 1e-4


HUB_IDS = {"black-forest-labs/FLUX.2-dev": (DEV, "flux2", False),
           "black-forest-labs/FLUX.2-klein-4B": (KLEIN, "flux2-klein", False),
           "black-forest-labs/FLUX.2-klein-9B": (KLEIN, "flux2-klein", False),
           "black-forest-labs/FLUX.2-klein-base-4B": (BASE, "flux2-klein", True),
           "black-forest-labs/FLUX.2-klein-base-9B": (BASE, "flux2-klein", True)}
"""The published ids -> (the preset whose saved directory stands in for it, its family, whether it runs CFG)."""


def test_the_hub_ids_resolve_from_the_cache(directories, tmp_path, monkeypatch):
    from tests.support.hub import add_snapshot

    cache = str(tmp_path / "hub")
    for repo, (preset, _, _) in HUB_IDS.items():
        add_snapshot(cache, repo, directories[preset], "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    try:
        for repo, (preset, name, cfg) in HUB_IDS.items():
            spec = resolve_model(repo)
            assert (spec.family, spec.uses_cfg, spec.media_inputs) == (name, cfg, ("image",)), repo
            assert spec.defaults == {"width": 1024, "height": 1024, "num_inference_steps": 50, "guidance_scale": 4.0}
            if "klein" in repo:  # its model_index.json says which model it is
                with open(os.path.join(spec.path, "model_index.json")) as handle:
                    assert json.load(handle)["is_distilled"] is (not cfg), repo
    finally:
        resolve_model.cache_clear()
