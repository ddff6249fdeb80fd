"""HunyuanVideo 1.5 (`tiny-hunyuan-video-15`, `tiny-hunyuan-video-15-i2v`): a job's frames equal
`HunyuanVideo15Pipeline.__call__`'s and `HunyuanVideo15ImageToVideoPipeline.__call__`'s own for the same row and
generator (identical frames), from the preset and from a saved directory, at two sizes (an I2V video's size is the
bucket of its image's aspect ratio, landscape and portrait); the row's guidance scale is the guider's, its default
the guider's config, and a guider beyond plain CFG is refused; ulysses 2, ring 2, tp 2, --fsdp and cfg 2 equal one
process; AutoencoderKLHunyuanVideo15 decodes and encodes patch-parallel as one rank does, at 2 and 4 ranks; an I2V
row without an image is rejected naming the column; the published ids resolve from the hub cache."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from genbatch.io.media_input import MediaReader
from genbatch.models import family, resolve_model
from genbatch.runner.loading import load_pipeline
from genbatch.runner.timing import JobTimer
from tests.models.pipeline_outputs import (
    assert_a_row_without_an_image_is_rejected,
    genbatch_frames,
    random_image,
    saved_preset,
)
from tests.support.runs import job, job_executor
from tests.support import executor as drive
from genbatch.jobs.prepared import PreparedJob

T2V = "tiny-hunyuan-video-15"
I2V = "tiny-hunyuan-video-15-i2v"
PROMPT = 'a red fox holding a sign that says "OPEN"'  # the quoted text goes through ByT5


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("hunyuan-video-15")
    return {preset: saved_preset(preset, root / preset) for preset in (T2V, I2V)}


def pipeline_frames(model: str, spec_job, image: str | None = None) -> np.ndarray:
    """The pipeline's own frames for the row: its guider set to the row's guidance scale (the pipeline takes
    none), the row's size for text-to-video (image-to-video takes none: its image decides)."""
    pipe = load_pipeline(resolve_model(model), torch.device("cpu"), torch.float32)
    pipe.guider = pipe.guider.new(guidance_scale=spec_job.guidance_scale)
    call = {"image": Image.open(image)} if image else {"height": spec_job.height, "width": spec_job.width}
    return pipe(prompt=spec_job.prompt, negative_prompt=spec_job.negative_prompt, num_frames=spec_job.num_frames,
                num_inference_steps=spec_job.num_inference_steps, output_type="np",
                generator=torch.Generator("cpu").manual_seed(spec_job.seed), **call).frames[0]


CASES = [  # (preset, from a saved directory, the row's (width, height) or the image's size, the frames' (h, w))
    pytest.param(T2V, False, (80, 48), (48, 80), id="t2v-preset"),
    pytest.param(T2V, True, (48, 64), (64, 48), id="t2v-directory-portrait", marks=pytest.mark.slow),
    pytest.param(I2V, False, (64, 48), (56, 72), id="i2v-preset-landscape-image"),
    pytest.param(I2V, True, (40, 64), (72, 48), id="i2v-directory-portrait-image", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("preset", "from_directory", "size", "frames"), CASES)
def test_output_equals_the_diffusers_pipeline(directories, tmp_path, preset, from_directory, size, frames):
    model = directories[preset] if from_directory else preset
    image = random_image(tmp_path / "in.png", size) if preset == I2V else None
    width, height = (64, 64) if image else size  # an I2V row's own size is not used
    spec_job = job(preset, model=model, prompt=PROMPT, negative_prompt="blurry", seed=11, num_inference_steps=2,
                   width=width, height=height, image=image)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    theirs = pipeline_frames(model, spec_job, image)
    assert ours.shape == theirs.shape == (spec_job.num_frames, *frames, 3)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.std() > 0.01


def _encode(pipe, preset: str, **fields):
    spec_job = job(preset, **fields)
    if spec_job.image:
        spec_job = PreparedJob.of(spec_job, media={"image": MediaReader().read("image", spec_job.image)})
    return family(resolve_model(preset).family).hooks.encode(pipe, spec_job, torch.device("cpu"))


def test_the_text_streams_and_the_guiders_branches(tmp_path):
    pipe = load_pipeline(resolve_model(T2V), torch.device("cpu"), torch.float32)
    quoted = _encode(pipe, T2V, prompt=PROMPT, guidance_scale=6.0)
    plain = _encode(pipe, T2V, prompt="a red fox", guidance_scale=1.0)
    assert list(quoted.branches) == ["cond", "uncond"] and list(plain.branches) == ["cond"]  # scale 1: no CFG
    cond = quoted.branches["cond"]
    # the Qwen text after the template's 108 tokens, padded to 1000; ByT5's of `Text "OPEN". `, padded to 256
    assert cond["encoder_hidden_states"].shape[:2] == cond["encoder_attention_mask"].shape == (1, 1000)
    assert 0 < int(cond["encoder_attention_mask"].sum()) < 1000
    glyph = cond["encoder_attention_mask_2"]
    assert glyph.shape == (1, 256) and int(glyph.sum()) == len('Text "OPEN". ') + 1  # its bytes and </s>
    assert not plain.branches["cond"]["encoder_attention_mask_2"].any()  # nothing quoted: masked zeros
    assert not cond["image_embeds"].any() and cond["image_embeds"].shape[1] == 729  # text-to-video: zero images
    # I2V: SigLIP's tokens of the image, in both branches
    image = random_image(tmp_path / "in.png", (64, 48))
    i2v = load_pipeline(resolve_model(I2V), torch.device("cpu"), torch.float32)
    branches = _encode(i2v, I2V, prompt=PROMPT, image=image).branches
    assert branches["cond"]["image_embeds"].shape == (1, 16, 16) and branches["cond"]["image_embeds"].abs().min() > 0
    assert branches["uncond"]["image_embeds"] is branches["cond"]["image_embeds"]


def test_the_guider_gives_the_default_scale_and_only_plain_cfg_runs(directories, tmp_path):
    import json
    import shutil

    from genbatch.models.hunyuan_video15 import runs_cfg

    model = str(tmp_path / "distilled")
    shutil.copytree(directories[T2V], model)
    saved = tmp_path / "distilled" / "guider" / "guider_config.json"
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "guidance_scale": 1.0}))
    spec = resolve_model(model)
    assert spec.defaults["guidance_scale"] == 1.0 and spec.uses_cfg  # a row may still ask for CFG
    assert resolve_model(directories[T2V]).defaults["guidance_scale"] == 6.0
    assert (spec.defaults["width"], spec.defaults["height"]) == (80, 48)  # the 16:9 bucket of 64^2 pixels
    pipe = load_pipeline(resolve_model(T2V), torch.device("cpu"), torch.float32)
    pipe.guider = pipe.guider.new(guidance_rescale=0.7)
    with pytest.raises(ValueError, match=r"guider sets \{'guidance_rescale': 0.7\}.*plain CFG"):
        runs_cfg(pipe, job(T2V))


def test_the_size_buckets_are_the_pipelines():
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    from genbatch.models.hunyuan_video15 import bucket_size

    for multiple, target in ((16, 640), (16, 960), (8, 64)):
        processor = HunyuanVideo15ImageProcessor(vae_scale_factor=multiple)
        for height, width in ((9, 16), (16, 9), (1, 1), (480, 848), (1080, 1920), (3, 4), (5, 2)):
            assert bucket_size(height, width, target, multiple) == processor.calculate_default_height_width(
                height, width, target)
    assert bucket_size(9, 16, 640, 16) == (480, 848) and bucket_size(9, 16, 960, 16) == (720, 1280)


def test_an_image_to_video_row_without_an_image_is_rejected_naming_the_column(tmp_path):
    spec = resolve_model(I2V)
    assert (spec.family, spec.media_inputs, spec.media_required, spec.uses_cfg) == (
        "hunyuan-video-15-i2v", ("image",), ("image",), True)
    assert_a_row_without_an_image_is_rejected(I2V, tmp_path, "a red fox")


def test_the_published_ids_resolve_from_the_hub_cache(directories, tmp_path, monkeypatch):
    from genbatch.models.hunyuan_video15 import HUB_IDS
    from tests.support.hub import add_snapshot

    cache = str(tmp_path / "hub")
    for name, preset in (("480p_t2v", T2V), ("720p_i2v", I2V)):
        add_snapshot(cache, HUB_IDS[name], directories[preset], "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolve_model.cache_clear()
    try:
        assert resolve_model("hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v").family == "hunyuan-video-15"
        assert resolve_model("hunyuanvideo-community/HunyuanVideo-1.5-720p_i2v").family == "hunyuan-video-15-i2v"
    finally:
        resolve_model.cache_clear()


def test_the_published_shapes_plan():
    import json

    from click.testing import CliRunner

    from genbatch.cli import main
    from genbatch.planner.shapes import resolve_shape

    shape = resolve_shape("hunyuanvideo-1.5-720p")
    assert (shape.width, shape.height, shape.frames, shape.num_heads, shape.text_tokens) == (1280, 720, 121, 16, 1985)
    # 31 latent frames of 45 x 80 tokens (VAE 16x, patch 1), then the text
    assert shape.sequence(1280, 720, 121) == 31 * 45 * 80 + 1985
    result = CliRunner().invoke(main, ["plan", "--model", "hunyuanvideo-1.5-480p", "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert any(layout["cfg"] == 2 for layout in json.loads(result.output)["layouts"])


def _layouts_on_ranks(rank, world_size, cases, out):
    from tests.parallel.test_layouts import _run_job

    return [_run_job(spec_job, *layout, out=f"{out}/{index}") for index, (spec_job, *layout) in enumerate(cases)]


LAYOUTS = [(1, 1, 1, 2, False), (1, 1, 2, 1, False), (1, 1, 1, 1, False, 2), (1, 1, 1, 2, True), (1, 2, 1, 1, False)]
"""(dp, cfg, ring, ulysses, fsdp[, tp]): ulysses 2, ring 2, tp 2, --fsdp (over ulysses 2) and cfg 2."""


def _check_layouts(jobs, tmp_path) -> None:
    from tests.parallel.test_layouts import _check, _run_job
    from tests.support.distributed import run_on_ranks

    cases = [(spec_job, *layout) for spec_job in jobs for layout in LAYOUTS]
    per_rank = run_on_ranks(_layouts_on_ranks, 2, args=(cases, str(tmp_path / "ranks")), timeout_s=300)
    reference = {spec_job.model: _run_job(spec_job, None, 1, 1, 1, False, out=str(tmp_path / f"one-{index}"))
                 for index, spec_job in enumerate(jobs)}
    _check(cases, per_rank, reference)


def test_text_to_video_layouts_equal_one_process(tmp_path):
    # 3 latent frames of 5 x 9 (135 video tokens) and 1985 text tokens: uneven over 2 ranks; one step (both
    # branches) keeps it within the family's share of `make test`, the I2V check below runs two
    _check_layouts([job(T2V, prompt=PROMPT, negative_prompt="blurry", width=72, height=40, num_inference_steps=1,
                        seed=17)], tmp_path)


@pytest.mark.slow
def test_image_to_video_layouts_equal_one_process(tmp_path):
    # the image's bucket 56 x 72: 3 latent frames of 7 x 9; its encode is patch-parallel over the group
    image = random_image(tmp_path / "in.png", (64, 48))
    _check_layouts([job(I2V, prompt=PROMPT, negative_prompt="blurry", num_inference_steps=2, seed=17, image=image)],
                   tmp_path)


VAE_CASES = [("decode", (1, 4, 3, 7, 6)), ("decode", (1, 4, 2, 2, 9)), ("decode", (1, 4, 1, 5, 4)),
             ("encode", (1, 3, 5, 56, 48)), ("encode", (1, 3, 1, 16, 64)), ("encode", (1, 3, 1, 40, 24))]
"""(direction, shape): latents (1, 4, f, h, w) to decode (strips of uneven height, 2-D tiles of a two-row latent, one
frame), pixels (1, 3, f, H, W) to encode (five frames, the one frame of an I2V image, tiles side by side). One row:
diffusers' own decoder fails on a batch of two (its mid-block mask does not broadcast over the batch), and genbatch
decodes a batch's rows one at a time."""


def _vae_on_ranks(rank, world_size, cases):
    import torch.distributed as dist

    from diffusers import AutoencoderKLHunyuanVideo15

    from genbatch.models.hunyuan_video15_tiny import TINY_VAE
    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.vae import parallel_decode, parallel_encoding, supports_parallel_encode
    from genbatch.parallel.vae.forwards import unsupported_reason

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**TINY_VAE).eval()
    results = []
    for direction, shape in cases:
        values = torch.randn(shape, generator=torch.Generator().manual_seed(len(results)))
        comm = Comm(dist.group.WORLD, CommLedger())
        with torch.no_grad():
            if direction == "decode":
                reference = vae.decode(values).sample
                ours = parallel_decode(vae, values, comm, leader_only=False)
            else:
                reference = vae.encode(values.clamp(-1, 1)).latent_dist.mode()
                with parallel_encoding(vae, comm):  # the pipeline's own retrieve_latents(argmax)
                    ours = vae.encode(values.clamp(-1, 1)).latent_dist.mode()
        swapped = [name for name, module in vae.named_modules() if "forward" in module.__dict__]
        results.append(dict(diff=(ours - reference).abs().max().item(), scale=reference.abs().max().item(),
                            restored=not swapped and "encode" not in vae.__dict__, sent=comm.ledger.take()))
    return unsupported_reason(vae), supports_parallel_encode(vae), results


@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_the_vae_decodes_and_encodes_patch_parallel_as_one_rank(world_size):
    from tests.support.distributed import run_on_ranks

    for reason, encodes, results in run_on_ranks(_vae_on_ranks, world_size, (VAE_CASES,), timeout_s=120):
        assert reason is None and encodes
        for (direction, shape), result in zip(VAE_CASES, results, strict=True):
            assert result["diff"] <= 1e-4 and result["scale"] > 0.1, (direction, shape, result)
            assert result["restored"] and result["sent"].get("p2p", 0) > 0, (direction, shape, result)


def test_the_replicated_border_is_what_makes_the_decode_exact():
    """Zero halos at the image's border (the rule of Wan's causal convolution) would not give the decode: the
    replication there is the difference."""
    import torch.nn.functional as F
    from diffusers import AutoencoderKLHunyuanVideo15

    from genbatch.models.hunyuan_video15_tiny import TINY_VAE

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**TINY_VAE).eval()
    conv = vae.decoder.conv_in
    x = torch.randn(1, 4, 2, 5, 6)
    with torch.no_grad():
        replicated = conv(x)
        zeros = conv.conv(F.pad(F.pad(x, (0, 0, 0, 0, 2, 0), mode="replicate"), (1, 1, 1, 1)))
    assert (replicated - zeros).abs().max() > 1e-3


@pytest.mark.slow
def test_the_prompt_its_quoted_text_the_guidance_and_the_image_move_the_frames(tmp_path):
    def frames(preset, jobs):
        with job_executor(str(tmp_path / preset), model=preset) as (world, executor):
            return [drive.generate(executor, spec_job, JobTimer(world.ctx.device)) for spec_job in jobs]

    base = dict(seed=3, num_inference_steps=2)
    fox, lighthouse, open_sign, shut_sign, weak = frames(T2V, [
        job(T2V, prompt="a red fox in the snow", **base), job(T2V, prompt="a lighthouse at dusk", **base),
        job(T2V, prompt='a sign that says "OPEN"', **base), job(T2V, prompt='a sign that says "SHUT"', **base),
        job(T2V, prompt="a red fox in the snow", guidance_scale=2.0, **base)])
    levels = lambda a, b: np.abs(a - b).max() * 255  # noqa: E731
    assert levels(fox, lighthouse) > 10 and levels(open_sign, shut_sign) > 10 and levels(fox, weak) > 10
    images = []
    for colour in (0, 255):
        images.append(str(tmp_path / f"{colour}.png"))
        Image.new("RGB", (64, 48), (colour,) * 3).save(images[-1])
    black, white = frames(I2V, [job(I2V, prompt="a red fox", image=image, **base) for image in images])
    assert levels(black[0], white[0]) > 20


@pytest.mark.slow
def test_a_batch_the_step_cache_and_compile_equal_one_row_uncached_and_eager(tmp_path):
    rows = [replace(job(T2V, prompt=prompt, num_inference_steps=2, seed=30 + index), id=f"row{index}", row=index)
            for index, prompt in enumerate((PROMPT, "a lighthouse at dusk"))]
    with job_executor(str(tmp_path / "eager"), model=T2V) as (world, executor):
        batched = drive.generate_batch(executor, rows, JobTimer(world.ctx.device))
        alone = [drive.generate(executor, row, JobTimer(world.ctx.device)) for row in rows]
        exact = drive.denoise(executor, rows[0], JobTimer(world.ctx.device))
        cached = drive.denoise(executor, replace(rows[0], cache="taylorseer:1"), JobTimer(world.ctx.device))
    for index, row in enumerate(rows):
        np.testing.assert_allclose(batched[index], alone[index], rtol=0, atol=2e-4, err_msg=row.id)
    assert torch.equal(cached, exact)  # a cache that skips nothing (diffusers' First-Block Cache knows no
    # HunyuanVideo15TransformerBlock: `--cache fbc` is refused naming it)
    with job_executor(str(tmp_path / "compiled"), model=T2V, compile=True, compile_backend="aot_eager") as (world,
                                                                                                        executor):
        compiled = drive.denoise(executor, rows[0], JobTimer(world.ctx.device))
    assert (compiled - exact).abs().max().item() <= 1e-4


def test_the_planner_prices_the_vae_as_it_decodes_and_encodes():
    from genbatch.models.vae_costs import HUNYUAN_VIDEO15_VAE
    from genbatch.planner.vae_encode import encode_peak_bytes
    from genbatch.planner.vae_memory import decode_peak_bytes

    memory = HUNYUAN_VIDEO15_VAE.decoder
    gib = lambda mode, ranks=1: decode_peak_bytes(memory, mode, width=1280, height=720, frames=121,  # noqa: E731
                                                  ranks=ranks, bytes_per_value=2) / 2**30
    # every frame at once, and the mid-block mask over 31 x 45 x 80 latent tokens squared (23 GiB of it)
    assert gib("full") > 141 > 2 * gib("parallel", 8) and gib("tiled") < 0.5 * gib("full")
    encoder = HUNYUAN_VIDEO15_VAE.encoder
    one = encode_peak_bytes(encoder, width=1280, height=720, frames=1, bytes_per_value=2)
    assert 0.45 * one < encode_peak_bytes(encoder, width=1280, height=720, frames=1, ranks=2, bytes_per_value=2) < one


@pytest.mark.slow
def test_gen_run_writes_both_families_videos_the_i2v_one_at_its_images_bucket(tmp_path):
    import pyarrow.parquet as pq

    from genbatch.io import decode_mp4
    from tests.support.runs import run_cli, write_manifest

    Image.new("RGB", (64, 48), (200, 90, 10)).save(tmp_path / "fox.png")
    rows = [{"id": "sign", "prompt": PROMPT, "model": T2V, "width": 48, "height": 32},
            {"id": "fox", "prompt": "a red fox", "model": I2V, "image": "fox.png"}]
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{**row, "num_frames": 5, "num_inference_steps": 2}
                                                            for row in rows])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "-q")
    assert result.returncode == 0, result.stderr
    shapes = {row["id"]: decode_mp4((tmp_path / "out" / "outputs" / f"{row['id']}.mp4").read_bytes()).shape
              for row in rows}
    assert shapes == {"sign": (5, 32, 48, 3), "fox": (5, 56, 72, 3)}  # a 64 x 48 image's bucket is 72 x 56
    results = pq.read_table(tmp_path / "out" / "results" / "results.parquet").to_pylist()
    assert {row["status"] for row in results} == {"done"}


def test_the_plans_name_real_modules():
    import fnmatch

    from genbatch.models.registry import module_blocks
    from genbatch.parallel.routing import sequence_routing
    from genbatch.runner.presets import build_preset

    pipe = build_preset(I2V, meta=("transformer", "text_encoder", "text_encoder_2"))
    plan = family("hunyuan-video-15-i2v").transformer_parts(type(pipe.transformer).__name__)
    assert plan is family("hunyuan-video-15").transformer_parts(type(pipe.transformer).__name__)
    children = dict(pipe.transformer.named_children())
    assert set(plan.blocks.before + plan.blocks.after + plan.blocks.repeated) <= set(children)
    named = [name for name, _ in pipe.transformer.named_modules()]
    _, cp_plan = sequence_routing(pipe.transformer)
    for key in cp_plan:
        assert any(fnmatch.fnmatchcase(name, key) for name in named), key
    # the mask is split at the blocks' attention modules alone (not their projections or norms)
    assert [name for name in named if fnmatch.fnmatchcase(name, "transformer_blocks.*.attn")] == [
        "transformer_blocks.0.attn", "transformer_blocks.1.attn"]
    for styles, model in ((plan.tensor_splits.styles, pipe.transformer),
                          *((family("hunyuan-video-15").text_encoder_splits[type(encoder).__name__].styles, encoder)
                            for encoder in (pipe.text_encoder, pipe.text_encoder_2))):
        modules = [name for name, _ in model.named_modules()]
        for pattern in styles:
            optional = pattern.endswith(("wi", "wi_0", "wi_1"))  # T5's plain or gated MLP: one of them
            assert optional or any(fnmatch.fnmatchcase(name, pattern) for name in modules), pattern
    for encoder in (pipe.text_encoder, pipe.text_encoder_2):
        blocks = module_blocks(type(encoder).__name__)
        assert all(isinstance(encoder.get_submodule(path), torch.nn.ModuleList) for path in blocks.repeated)


@pytest.mark.slow
def test_a_meanflow_image_to_video_model_equals_the_pipeline(tmp_path):
    """A step-distilled I2V transformer (`use_meanflow`) takes the next step's timestep too (0 at the last)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from genbatch.models.hunyuan_video15_tiny import TINY_I2V_TRANSFORMER, scale_for_tests
    from genbatch.models.tiny import seeded

    pipe = load_pipeline(resolve_model(I2V), torch.device("cpu"), torch.float32)
    pipe.transformer = seeded(5, lambda: HunyuanVideo15Transformer3DModel(**TINY_I2V_TRANSFORMER, use_meanflow=True))
    scale_for_tests(pipe.transformer)
    model = str(tmp_path / "meanflow")
    pipe.save_pretrained(model)
    image = random_image(tmp_path / "in.png", (64, 48))
    spec_job = job(I2V, model=model, prompt=PROMPT, seed=5, num_inference_steps=3, image=image)
    ours = genbatch_frames(model, spec_job, str(tmp_path / "out"))
    np.testing.assert_array_equal(ours, pipeline_frames(model, spec_job, image))
