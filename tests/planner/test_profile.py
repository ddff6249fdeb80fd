"""Calibration profiles: JSON round trip under the user's config directory, clear errors, and the cost model
taking a profile's parameters where it has them and the published figures elsewhere."""

from __future__ import annotations

import json
import os

import pytest

from genbatch.parallel.dims import ParallelDims
from genbatch.planner.cost import estimate
from genbatch.planner.hardware import cpu_cluster, make_cluster
from genbatch.planner.profile import SCHEMA, Profile, load_profile, profile_path, save_profile
from genbatch.planner.shapes import resolve_shape
from genbatch.planner.workload import make_workload

FLUX = make_workload(resolve_shape("flux.1-dev"))
H100x4 = make_cluster(4, gpu="h100")


def _profile(**fields) -> Profile:
    return Profile(name="lab", device="h100", **fields)


def test_saved_by_name_under_xdg_config_home_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    profile = _profile(gemm_tflops=500.0, bandwidth_gbs={"nvlink/all_to_all": 150.0}, latency_s={"nvlink/all_to_all": 2e-5},
                       fit={"steps": 12})
    path = save_profile(profile, "lab")
    assert path == str(tmp_path / "config" / "genbatch" / "profiles" / "lab.json")
    assert json.load(open(path))["schema"] == SCHEMA
    assert load_profile("lab") == profile
    assert load_profile(path) == profile  # a path works as well as a name


def test_default_directory_without_xdg_is_dot_config(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert profile_path("lab") == os.path.join(str(tmp_path), ".config", "genbatch", "profiles", "lab.json")
    assert profile_path("./mine.json") == "./mine.json"


def test_a_file_that_is_not_a_profile_is_refused_with_the_fix(tmp_path):
    missing, other, old = tmp_path / "missing.json", tmp_path / "other.json", tmp_path / "old.json"
    other.write_text(json.dumps({"layouts": []}))
    old.write_text(json.dumps({"schema": SCHEMA + 1, "name": "x", "device": "cpu"}))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="no profile"):
        load_profile(str(missing))
    with pytest.raises(ValueError, match="is not a genbatch profile.*--calibrate"):
        load_profile(str(other))
    with pytest.raises(ValueError, match="schema"):
        load_profile(str(old))
    with pytest.raises(ValueError, match="is not a genbatch profile"):
        load_profile(str(tmp_path / "broken.json"))


def test_an_empty_profile_prices_as_the_published_figures():
    for name in ("single", "ulysses4", "cfg2-ring2", "dp2-ulysses2-fsdp"):
        layout = ParallelDims.parse(name)
        assert estimate(layout, FLUX, H100x4, _profile()) == estimate(layout, FLUX, H100x4)


def test_profile_parameters_replace_the_published_ones_they_measured():
    layout = ParallelDims(ulysses=4)
    published = estimate(layout, FLUX, H100x4)
    slower = estimate(layout, FLUX, H100x4, _profile(gemm_tflops=0.71 * 989.4 / 2, attention_tflops=0.30 * 989.4 / 2))
    assert slower.compute_s == pytest.approx(2 * published.compute_s)
    assert slower.comm_exposed_s == pytest.approx(published.comm_exposed_s)  # links keep their figures
    measured_link = estimate(layout, FLUX, H100x4, _profile(bandwidth_gbs={"nvlink/all_to_all": 30.0},
                                                            latency_s={"nvlink/all_to_all": 0.0}))
    # Ulysses' all-to-alls now cost their bytes at the measured 30 GB/s; the SP gather keeps its modelled time
    expected = published.comm_exposed_s - _ulysses_s(published) + published.comm_bytes["ulysses"] / 30e9
    assert measured_link.comm_exposed_s == pytest.approx(expected, rel=1e-9)
    assert measured_link.comm_exposed_s > published.comm_exposed_s
    overhead = estimate(layout, FLUX, H100x4, _profile(layer_overhead_s=0.0))
    assert overhead.overhead_s == 0.0 and published.overhead_s > 0


def _ulysses_s(published) -> float:
    """The modelled seconds of the Ulysses all-to-alls alone (bytes over NVLink, four latencies a layer)."""
    link = H100x4.intra
    return published.comm_bytes["ulysses"] / (link.gbs * 1e9) + published.comm_messages["ulysses"] * link.latency_s


def test_core_sharing_slows_compute_by_the_ranks_that_share_cores():
    layout = ParallelDims(ulysses=4)
    alone = estimate(layout, FLUX, H100x4, _profile(core_sharing=0.0))
    shared = estimate(layout, FLUX, H100x4, _profile(core_sharing=0.5))
    assert shared.compute_s == pytest.approx(alone.compute_s * (1 + 0.5 * 3))


def test_ranks_beyond_a_cpus_cores_time_slice_its_bulk_copies_but_not_its_activation_exchanges():
    layout = ParallelDims.parse("ring2-ulysses2-fsdp")
    work = make_workload(resolve_shape("wan2.1-1.3b"), width=416, height=240)
    cpu = cpu_cluster(4)
    gloo = {f"gloo/{kind}": 0.5 for kind in ("p2p", "all_to_all", "fsdp_all_gather", "sp_gather")}
    on_cores = {cores: estimate(layout, work, cpu, Profile(name="cpu", device="cpu", gemm_tflops=0.3,
                                                           core_sharing=0.0, cpu_cores=cores,
                                                           bandwidth_gbs=gloo, latency_s={}))
                for cores in (4, 2)}
    bulk = sum(on_cores[4].comm_bytes[axis] for axis in ("ring", "fsdp")) / 0.5e9
    # 4 ranks on 2 cores: the ring's K/V passes and FSDP's all-gathers take twice as long, Ulysses' all-to-alls
    # and the output gather do not (their time is waiting for peers), and compute doubles
    assert on_cores[2].comm_s - on_cores[4].comm_s == pytest.approx(bulk, rel=1e-9)
    assert on_cores[2].compute_s == pytest.approx(2 * on_cores[4].compute_s)
