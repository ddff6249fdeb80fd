"""Model shapes (published, presets, diffusers directories) and the hardware description."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genbatch.models import UnknownModelError, families, resolve_model
from genbatch.planner.hardware import GPUS, make_cluster
from genbatch.planner.shapes import PUBLISHED, resolve_shape


def test_published_token_counts_match_seed():
    # seed 000 §1: "FLUX.1-dev 1024²：N = 4608、d = 3072、L = 57"; "Wan2.1-14B 720p 81 帧：N = 75,600、d = 5120、L = 40"
    flux, wan = resolve_shape("flux.1-dev"), resolve_shape("wan2.1-14b")
    assert (flux.sequence(1024, 1024, None), flux.hidden_size, flux.num_layers) == (4608, 3072, 57)
    assert (wan.sequence(1280, 720, 81), wan.hidden_size, wan.num_layers) == (75600, 5120, 40)
    assert not flux.uses_cfg and wan.uses_cfg and not resolve_shape("hunyuanvideo").uses_cfg


@pytest.mark.parametrize(("edit", "base"), [("flux.1-kontext-dev", "flux.1-dev"), ("qwen-image-edit", "qwen-image"),
                                            ("tiny-flux-kontext", "tiny-flux"), ("tiny-qwen-image-edit", "tiny-qwen-image")])
def test_an_edit_models_sequence_carries_the_input_images_tokens(edit, base):
    edit_shape, base_shape = resolve_shape(edit), resolve_shape(base)
    tokens = base_shape.image_tokens(1024, 768, None)
    assert edit_shape.joins_image_tokens and not base_shape.joins_image_tokens
    assert edit_shape.image_tokens(1024, 768, None) == tokens  # the output's: what a step predicts
    assert edit_shape.sequence(1024, 768, None) == base_shape.sequence(1024, 768, None) + tokens


def test_every_issue_model_is_published_with_consistent_facts():
    names = {"flux.1-dev", "sd3-medium", "wan2.1-1.3b", "wan2.1-14b", "hunyuanvideo", "cogvideox-5b",
             "cogvideox1.5-5b", "qwen-image", "flux.1-kontext-dev", "qwen-image-edit", "wan2.1-i2v-14b", "z-image-turbo",
             "qwen-image-2.1", "flux.2-dev", "flux.2-klein", "flux.2-klein-9b", "flux.2-klein-base",
             "flux.2-klein-base-9b", "ltx-2", "hunyuanvideo-1.5-480p", "hunyuanvideo-1.5-720p",
             "hunyuanvideo-1.5-i2v-480p", "hunyuanvideo-1.5-i2v-720p"}
    assert names == set(PUBLISHED)
    for shape in PUBLISHED.values():
        # one stream's attention + MLP weights per layer; dual-stream MMDiT blocks and adaLN add up to ~3x
        per_layer = 4 * shape.hidden_size**2 + 2 * shape.hidden_size * shape.ffn_dim
        assert 0.9 < shape.parameters / (shape.num_layers * per_layer) < 3.2, shape.name
        assert shape.image_tokens(shape.width, shape.height, shape.frames) > 1000
    assert resolve_shape("FLUX.1-dev").name == "FLUX.1-dev"


def test_a_published_model_is_its_family_record_by_name_or_hub_id():
    for family in families().values():
        for published in family.published:
            shape = resolve_shape(published.name)
            assert (shape.family, shape.hub_id, shape.parameters, shape.vae_costs) == (
                family.name, published.hub_id, published.parameters, family.vae_costs), published.name
            assert replace(resolve_shape(published.hub_id), name=published.name) == shape
            assert resolve_shape(published.hub_id + "@main").hub_id == published.hub_id


def test_presets_come_through_resolve_model():
    spec = resolve_model("tiny-wan")
    shape = resolve_shape("tiny-wan")
    assert (shape.num_layers, shape.num_heads, shape.head_dim, shape.ffn_dim) == (2, 4, 12, 32)
    assert shape.image_tokens(64, 48, 9) == spec.tokens(64, 48, 9)
    assert shape.uses_cfg and not shape.joint_text
    assert resolve_shape(spec) == shape


def test_pipeline_directory_counts_parameters_from_safetensors(tmp_path):
    from genbatch.runner.presets import build_preset

    pipe = build_preset("tiny-flux")
    pipe.save_pretrained(tmp_path)
    shape = resolve_shape(str(tmp_path))
    assert shape.parameters == sum(p.numel() for p in pipe.transformer.parameters())
    encoders = [pipe.text_encoder, pipe.text_encoder_2]
    assert shape.text_encoder_parameters == sum(p.numel() for enc in encoders for p in enc.parameters())
    assert shape.vae_parameters == sum(p.numel() for p in pipe.vae.parameters())
    assert shape.joint_text and shape.num_layers == 2 and shape.out_channels == 16


def test_a_hunyuan_video_directory_is_priced_with_its_own_vae_and_all_reduces(tmp_path):
    from genbatch.runner.presets import build_preset

    build_preset("tiny-hunyuan-video").save_pretrained(tmp_path)
    shape = resolve_shape(str(tmp_path))
    published = resolve_shape("hunyuanvideo")
    assert shape.vae_class == published.vae_class == "AutoencoderKLHunyuanVideo"
    assert shape.vae_costs == published.vae_costs != resolve_shape("tiny-wan").vae_costs  # not Wan's VAE
    assert shape.tp_all_reduces == 1.5  # one dual-stream block (2) and one single-stream block (1)


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-flux", "tiny-sd3", "tiny-hunyuan-video", "tiny-qwen-image"])
def test_a_preset_is_priced_at_the_all_reduces_its_tensor_plan_makes(name):
    from genbatch.models import family, resolve_model
    from genbatch.runner.presets import build_preset

    model = build_preset(name).transformer
    plan = family(resolve_model(name).family).transformer_parts(type(model).__name__).tensor_splits
    blocks = {path: len(getattr(model, path)) for path in plan.all_reduces}
    assert resolve_shape(name).tp_all_reduces == plan.all_reduces_per_layer(blocks)
    if name == "tiny-wan":
        assert resolve_shape(name).tp_all_reduces == resolve_shape("wan2.1-14b").tp_all_reduces == 3.0


def test_unknown_model_lists_the_published_names():
    with pytest.raises(UnknownModelError, match="flux.1-dev, flux.1-kontext-dev, sd3-medium"):
        resolve_shape("no-such-model")


def test_cluster_defaults_follow_the_gpu():
    assert make_cluster(8).intra.name == "nvlink" and make_cluster(8).inter is None
    l40 = make_cluster(8, gpu="l40")
    assert l40.intra.name == "pcie" and l40.cross_socket is not None and l40.memory_gib == 45.0
    assert make_cluster(8, gpu_mem=40).memory_gib == 40
    two = make_cluster(16, nodes=2, interconnect="ethernet")
    assert two.inter.name == "ethernet" and abs(two.inter.gbs - 3.0) < 0.1  # seed 000 §11 Q2: "约 3 GB/s"
    assert make_cluster(16, nodes=2).inter.name == "infiniband"
    assert make_cluster(16, nodes=2, interconnect="ethernet", network_gbps=100).inter.gbs == pytest.approx(12)
    assert make_cluster(16, nodes=2, intra_node="pcie").intra.name == "pcie"
    assert all(gpu.source and gpu.bf16_tflops > 0 and gpu.memory_gib > 0 for gpu in GPUS.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 8, "gpu": "k80"}, "unknown --gpu 'k80'; choose one of"),
        ({"gpus": 8, "nodes": 3}, "cannot be spread evenly"),
        ({"gpus": 8, "interconnect": "ethernet"}, "give nvlink or pcie for one node"),
        ({"gpus": 16, "nodes": 2, "interconnect": "nvlink"}, "give ethernet or infiniband"),
        ({"gpus": 8, "gpu": "l40", "interconnect": "nvlink"}, "l40 has no NVLink; use --interconnect pcie"),
        ({"gpus": 8, "gpu_mem": -1}, "--gpu-mem -1 must be positive"),
        ({"gpus": 0}, "--gpus 0 must be at least 1"),
        ({"gpus": 8, "network_gbps": 100}, "--network-gbps sets the link between nodes"),
        ({"gpus": 8, "interconnect": "carrier-pigeon"}, "unknown --interconnect"),
    ],
)
def test_cluster_validation_names_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_cluster(**kwargs)
