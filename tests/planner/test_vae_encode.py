"""The VAE encode of image-conditioned jobs: what each model encodes, its peak per rank (split over the job group
where the VAE encodes patch-parallel), its seconds, and the rejection of a layout whose encode does not fit."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from genbatch.cli import main
from genbatch.parallel.dims import ParallelDims
from genbatch.planner import plan
from genbatch.planner.conditioning import encode_input
from genbatch.planner.cost import encode_seconds, estimate
from genbatch.planner.hardware import make_cluster
from genbatch.planner.memory import memory_per_rank, vae_encode_gib
from genbatch.planner.rank import workload_for
from genbatch.planner.report import format_table
from genbatch.planner.shapes import resolve_shape
from genbatch.models.vae_costs import WAN_ENCODER
from genbatch.planner.vae_encode import encode_peak_bytes

GIB = 2**30
I2V = "wan2.1-i2v-14b"


def _work(model: str, **options):
    return workload_for(resolve_shape(model), **options)


def test_each_model_encodes_what_its_pipeline_encodes():
    wan = _work(I2V).encode  # the conditioning video at the output's size and frames
    assert (wan.width, wan.height, wan.frames, wan.what) == (1280, 720, 81, "conditioning video")
    assert _work("wan2.1-14b").encode is None and _work("flux.1-dev").encode is None
    # the edit models encode their input at about a megapixel, at the output's aspect ratio
    kontext = _work("flux.1-kontext-dev", width=1280, height=720).encode
    assert (kontext.width, kontext.height) == (1360, 768)
    qwen = _work("qwen-image-edit", width=1024, height=1024).encode
    assert (qwen.width, qwen.height, qwen.frames) == (1024, 1024, None)
    given = _work("qwen-image-edit", input_size=(832, 1248)).encode
    assert (given.width, given.height) == (832, 1248)
    # presets say what they take: Wan 2.2 TI2V encodes its image alone, the tiny Kontext keeps the image's size
    ti2v = _work("tiny-wan22-ti2v").encode
    assert ti2v.frames is None and ti2v.what == "first frame"
    assert _work("tiny-wan-i2v").encode.frames == 9
    assert _work("tiny-flux-kontext", width=64, height=48).encode.width == 64


def test_image_flags_are_checked_against_the_model():
    with pytest.raises(ValueError, match="takes no image"):
        _work("flux.1-dev", image=True)
    with pytest.raises(ValueError, match="starts from an image; drop --no-image"):
        _work("qwen-image-edit", image=False)
    with pytest.raises(ValueError, match="output's size; drop --input-size"):
        encode_input(resolve_shape(I2V), width=1280, height=720, frames=81, input_size=(640, 480))
    # Kontext without an image runs as FLUX.1: no encode, and the output's tokens alone
    plain = _work("flux.1-kontext-dev", image=False)
    assert plain.encode is None and plain.sequence == _work("flux.1-dev").sequence


def test_patch_parallel_lowers_the_encode_about_one_over_p():
    work = _work(I2V)
    one = vae_encode_gib(ParallelDims(), work)
    # 13.0 GiB for one rank in fp32 (the runner keeps a video VAE in fp32): counted 13,261 MiB on diffusers'
    # encoder (bench/results/cpu/vae_memory-encode.txt)
    assert one == pytest.approx(13261 / 1024, rel=0.02)
    whole_input = 3 * 81 * 1280 * 720 * 4 / GIB  # every rank holds the conditioning video it was handed
    for p in (2, 4, 8):
        split = vae_encode_gib(ParallelDims(ulysses=p), work)
        assert split == pytest.approx((one - whole_input) / p + whole_input * (1 + 1 / p), rel=1e-6)
        assert one / p < split < one / p + 0.08 * one
    # the same group under CFG parallel encodes patch-parallel too (the runner's job group)
    assert vae_encode_gib(ParallelDims(cfg=2), work) == pytest.approx(vae_encode_gib(ParallelDims(ulysses=2), work))
    assert encode_peak_bytes(WAN_ENCODER, width=1280, height=720, frames=81, ranks=1) < \
        encode_peak_bytes(WAN_ENCODER, width=1280, height=720, frames=81, ranks=1, channels=192)


def test_the_encode_is_its_own_part_of_the_peak_and_of_the_seconds():
    work = _work(I2V)
    # with a tiled decode (what auto gives one rank at 44 GiB) the encode's 13.0 GiB sets the peak; with a full
    # one the decode's 17.6 does (both in the fp32 the runner keeps a video VAE in)
    parts = memory_per_rank(ParallelDims(), work, "tiled")
    resident = parts["weights"] + parts["text_encoder"] + parts["vae_weights"] + parts["reserve"]
    assert parts["vae_encode"] > max(parts["activations"], parts["vae_decode"])
    assert parts["total"] == pytest.approx(resident + parts["vae_encode"])
    full = memory_per_rank(ParallelDims(), work, "full")
    assert full["vae_decode"] > full["vae_encode"] == parts["vae_encode"]
    assert full["total"] == pytest.approx(resident + full["vae_decode"])
    assert memory_per_rank(ParallelDims(), _work("wan2.1-14b"), "full")["vae_encode"] == 0.0
    cluster = make_cluster(8)
    alone, split = (encode_seconds(layout, work, cluster) for layout in (ParallelDims(), ParallelDims(ulysses=8)))
    assert 1.0 < alone < 20.0 and split < alone / 7  # 1/8 of the work, plus the latent's all-gather
    cost = estimate(ParallelDims(ulysses=8), work, cluster)
    assert cost.encode_s == pytest.approx(split)
    denoise = cost.seconds_per_job - cost.encode_s - cost.decode_s - cost.pipeline_s
    assert denoise == pytest.approx(work.steps * cost.seconds_per_step)


def test_one_rank_per_job_on_a_small_gpu_is_rejected_for_the_encode_with_a_fix():
    result = plan(I2V, 8, gpu_mem=44, offload_text_encoder=True)
    dp8 = next(rejection for rejection in result.rejected if rejection.layout == ParallelDims(dp=8))
    assert dp8.over is not None and dp8.over.part == "vae_encode"
    assert "vae_encode 13.0" in dp8.reasons[0] and "vae_encode sets the peak" in dp8.reasons[0]
    fix = dp8.fix  # more ranks per job: the encode patch-parallel over them
    assert fix is not None and fix.layout.group_size > 1 and fix.memory_gib <= 44
    assert fix.change in dp8.reasons[0]
    assert all(candidate.estimate.memory["total"] <= 44 for candidate in result.ranked)
    # with room for it, one rank per job runs the encode whole
    roomy = plan(I2V, 8, gpu_mem=80, offload_text_encoder=True)
    assert roomy.best.layout == ParallelDims(dp=8) and roomy.best.estimate.encode_s > 1.0


def test_the_table_and_json_show_the_encode_where_the_model_has_one():
    table = format_table(plan(I2V, 8, gpu_mem=44, offload_text_encoder=True), top=3)
    header = next(line for line in table.splitlines() if line.startswith("#"))
    assert "enc" in header.split() and "enc s" in header
    assert "VAE-encoding its conditioning video 1280x720x81f" in table
    assert "enc" not in format_table(plan("wan2.1-14b", 8), top=3).splitlines()[3].split()
    import json

    out = CliRunner().invoke(main, ["plan", "-m", "flux.1-kontext-dev", "-g", "2", "--json", "--input-size",
                                    "1184x880"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["workload"]["encode"] == {"what": "input image", "width": 1184, "height": 880, "frames": None}
    layout = data["layouts"][0]
    assert layout["breakdown"]["memory_gib"]["vae_encode"] > 0 and layout["breakdown"]["encode_s_per_job"] > 0
    assert layout["explain"]["terms_s_per_job"]["encode_s"] == pytest.approx(
        layout["breakdown"]["encode_s_per_job"], rel=1e-3)
    bad = CliRunner().invoke(main, ["plan", "-m", "flux.1-kontext-dev", "-g", "1", "--input-size", "big"])
    assert bad.exit_code != 0 and "WIDTHxHEIGHT" in bad.output
