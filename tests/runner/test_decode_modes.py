"""`gen run --vae-decode auto|full|tiled|parallel`: each mode runs and its results row says which it used; auto
takes an exact mode that fits and tiles only when a small memory limit forces it; tiled output differs from the
full decode, patch-parallel output equals it (the criterion of tests/parallel/test_vae.py)."""

from __future__ import annotations

from dataclasses import replace

import pyarrow.parquet as pq
import pytest
import torch

from genbatch.models import resolve_model
from genbatch.planner.shapes import resolve_shape
from genbatch.models.registry import vae_costs_of_class
from genbatch.planner.vae_memory import decode_peak_bytes
from genbatch.runner.decode import mode_problem
from tests.support.distributed import run_on_ranks
from tests.support.runs import run_cli, write_manifest

TOLERANCE = 1e-4
"""Patch-parallel against one-rank decode, as tests/parallel/test_vae.py holds it."""
SIZE = (128, 128, None)
"""A 16 x 16 latent, which tiny-flux's VAE (sample_size 64) tiles into overlapping 64-pixel tiles."""


def _flux_vae():
    from genbatch.runner.presets import build_preset

    torch.manual_seed(0)
    return build_preset("tiny-flux").vae.eval()


def _peak(vae, mode: str, ranks: int = 1, side: int = 128) -> float:
    """The planner's decode peak of a `side`-pixel square image in fp32."""
    return decode_peak_bytes(vae_costs_of_class(type(vae).__name__, is_video=False).decoder, mode, width=side, height=side,
                             frames=None, ranks=ranks, bytes_per_value=4, channels=vae.config["block_out_channels"][0],
                             tile=(vae.tile_sample_min_size,) * 2)


def _decode_in_every_mode(rank: int, world: int) -> dict:
    """On 2 gloo ranks (one job group): the same latent decoded in each mode, and auto's choices under limits."""
    from genbatch.parallel.context import build_context
    from genbatch.parallel.dims import ParallelDims
    from genbatch.runner.decode import Decoder

    ctx = build_context(ParallelDims(ulysses=world), torch.device("cpu"))
    vae = _flux_vae()
    latents = torch.randn((1, 16, 16, 16), generator=torch.Generator().manual_seed(1))
    out = {}
    with torch.no_grad():
        for mode in ("parallel", "full", "tiled"):
            decoder = Decoder(ctx=ctx, mode=mode)
            decoded = decoder.decode(type("Pipe", (), {"vae": vae}), latents, SIZE)
            out[mode] = (decoder.last_mode, None if decoded is None else decoded.clone())
        # auto: no limit to speak of, then one between the tiled and the patch-parallel peak
        tight = (_peak(vae, "tiled") + _peak(vae, "parallel", world)) / 2
        for name, limit in (("auto-roomy", 2**40), ("auto-tight", int(tight))):
            out[name] = Decoder(ctx=ctx, mode="auto", memory_bytes=limit).choose(vae, latents, SIZE)
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return run_on_ranks(_decode_in_every_mode, 2, timeout_s=120)


def test_each_mode_decodes_in_its_mode_on_a_group(two_ranks):
    leader, other = two_ranks
    assert {mode: leader[mode][0] for mode in ("parallel", "full", "tiled")} == {
        "parallel": "parallel", "full": "full", "tiled": "tiled"}
    assert all(other[mode][1] is None for mode in ("parallel", "full", "tiled"))  # the leader alone holds the image


def test_parallel_equals_full_and_tiled_differs(two_ranks):
    leader = two_ranks[0]
    full, parallel, tiled = (leader[mode][1] for mode in ("full", "parallel", "tiled"))
    assert full.shape == parallel.shape == tiled.shape == (1, 3, 128, 128)
    assert (parallel - full).abs().max().item() < TOLERANCE
    assert (tiled - full).abs().max().item() > 100 * TOLERANCE  # blended tiles: not the full decode


def test_auto_takes_parallel_when_it_fits_and_tiles_only_when_forced(two_ranks):
    for rank in two_ranks:  # every rank of the group chooses alike
        assert rank["auto-roomy"] == "parallel" and rank["auto-tight"] == "tiled"


def test_auto_on_one_rank_takes_full_when_it_fits():
    from genbatch.parallel.context import single_process_context
    from genbatch.runner.decode import Decoder

    vae = _flux_vae()
    latents = torch.zeros((1, 16, 16, 16))
    ctx = single_process_context(torch.device("cpu"))
    assert Decoder(ctx=ctx, memory_bytes=int(_peak(vae, "full") * 1.01)).choose(vae, latents, SIZE) == "full"
    assert Decoder(ctx=ctx, memory_bytes=int(_peak(vae, "full") * 0.99)).choose(vae, latents, SIZE) == "tiled"
    assert Decoder(ctx=ctx, mode="parallel").choose(vae, latents, SIZE) == "full"  # a group of one decodes whole


def test_gen_run_writes_each_jobs_mode_to_its_results_row(tmp_path):
    vae = _flux_vae()
    rows = [{"id": "small", "prompt": "a cat", "num_inference_steps": 1},
            {"id": "big", "prompt": "a dog", "width": 128, "height": 128, "num_inference_steps": 1}]
    manifest = write_manifest(str(tmp_path / "m.parquet"), rows)
    # a limit that holds the 64-pixel image's full decode (one tile), not the 128-pixel one's
    limit_gib = _peak(vae, "full", side=64) * 1.2 / 2**30
    modes = {}
    for name, args in (("auto", ("--vae-memory", f"{limit_gib:.9f}")), ("tiled", ("--vae-decode", "tiled")),
                       ("full", ("--vae-decode", "full"))):
        out = tmp_path / name
        result = run_cli("run", manifest, "--out", str(out), "--model", "tiny-flux", "-q", *args)
        assert result.returncode == 0, result.stderr
        table = pq.read_table(out / "results" / "results.parquet").to_pylist()
        modes[name] = {row["id"]: row["vae_decode"] for row in table}
    assert modes == {"auto": {"small": "full", "big": "tiled"}, "tiled": {"small": "tiled", "big": "tiled"},
                     "full": {"small": "full", "big": "full"}}


def test_a_mode_the_vae_cannot_run_stops_the_run_at_start_up(tmp_path):
    assert "no patch-parallel decode for AutoencoderKLHunyuanVideo" in mode_problem(
        "parallel", resolve_model("tiny-hunyuan-video"))
    wan = resolve_shape("tiny-wan")
    no_tiling = replace(wan, vae_costs=replace(wan.vae_costs, decoder=replace(wan.vae_costs.decoder,
                                                                              vae_class="AutoencoderSAME")))  # diffusers: no enable_tiling
    assert "has no tiling of its own" in mode_problem("tiled", no_tiling)
    assert mode_problem("tiled", resolve_model("tiny-wan")) is None and mode_problem("auto", no_tiling) is None
    manifest = write_manifest(str(tmp_path / "m.parquet"), [{"id": "a", "prompt": "a cat"}])
    result = run_cli("run", manifest, "--out", str(tmp_path / "out"), "--model", "tiny-hunyuan-video",
                     "--vae-decode", "parallel")
    assert result.returncode == 2 and "use --vae-decode full, tiled or auto" in result.stderr
    assert run_cli("run", manifest, "--out", str(tmp_path / "o2"), "--vae-parallel").returncode == 2  # replaced



def test_gen_submit_and_gen_bench_pass_the_mode_on_to_gen_run(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from genbatch.cli import main

    submit = ["submit", "m.parquet", "--out", str(tmp_path / "run"), "--nodes", "1", "--gpus-per-node", "1",
              "--python", "/usr/bin/python3", "--dry-run"]
    result = CliRunner().invoke(main, [*submit, "--vae-decode", "tiled"])
    assert result.exit_code == 0, result.output
    assert "--vae-decode tiled" in " ".join(result.output.replace("\\\n", " ").split())
    refused = CliRunner().invoke(main, [*submit, "--vae-parallel"])
    assert refused.exit_code == 2 and "gen run would refuse" in refused.output
    seen = []

    def run_bench(options) -> int:  # what gen bench would hand every layout's gen run
        seen.append(options.run_args)
        return 0

    monkeypatch.setattr("genbatch.benchmark.nightly.run_bench", run_bench)
    bench = CliRunner().invoke(main, ["bench", "--suite", "tiny", "--out", str(tmp_path / "b"), "--vae-decode", "full"])
    assert bench.exit_code == 0 and seen[0][-2:] == ("--vae-decode", "full")
