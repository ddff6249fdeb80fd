"""Text encoders split tensor-parallel over a job group (`--text-encoder-parallel tp`) give the replicated
encoder's embeddings within 1e-5: tiny UMT5 (Wan), T5 (FLUX, SD3), CLIP with and without its projection, the
Qwen2.5-VL language model (Qwen-Image: grouped-query attention, the key/value heads split too) and Llama
(HunyuanVideo), each on two gloo ranks. The presets' own encoders have an MLP 37 wide, which two ranks do not
divide, so these are the presets' configs with an MLP of 38; the presets' encoders are refused naming the fix.
The `auto` policy: FSDP under --fsdp, otherwise tp from 4096 wide and replicate below.
"""

from __future__ import annotations

import pytest
import torch

from genbatch.models import family
from genbatch.models.base import TensorSplits
from genbatch.parallel.tensor import encoders
from tests.parallel.test_layouts import WAN, references  # noqa: F401
from tests.support.distributed import run_on_ranks

VOCAB = 64


def _encoders() -> dict[str, tuple[torch.nn.Module, TensorSplits]]:
    """name -> (an encoder with seeded weights, its family's plan)."""
    from transformers import (CLIPTextModel, CLIPTextModelWithProjection, LlamaConfig, LlamaModel, Qwen2_5_VLConfig,
                              Qwen2_5_VLForConditionalGeneration, T5Config, T5EncoderModel, UMT5Config,
                              UMT5EncoderModel)

    from genbatch.models.hunyuan_video import TINY_LLAMA
    from genbatch.models.qwen_image import TINY_TEXT_ENCODER, TINY_VISION
    from genbatch.models.tiny import clip_config, t5_config

    t5 = {**t5_config(VOCAB), "d_ff": 38}
    clip = clip_config(VOCAB)
    clip.intermediate_size = 38
    special = dict(pad_token_id=0, bos_token_id=None, eos_token_id=1)
    qwen = Qwen2_5_VLConfig(text_config={**TINY_TEXT_ENCODER, "intermediate_size": 38, "vocab_size": VOCAB, **special},
                            vision_config=TINY_VISION, vocab_size=VOCAB, image_token_id=VOCAB, video_token_id=VOCAB + 1,
                            vision_start_token_id=VOCAB + 2, vision_end_token_id=VOCAB + 3,
                            vision_token_id=VOCAB + 4, **special)
    builds = {
        "UMT5EncoderModel": ("wan", lambda: UMT5EncoderModel(UMT5Config(**t5))),
        "T5EncoderModel": ("flux", lambda: T5EncoderModel(T5Config(**t5))),
        "CLIPTextModel": ("flux", lambda: CLIPTextModel(clip)),
        "CLIPTextModelWithProjection": ("sd3", lambda: CLIPTextModelWithProjection(clip)),
        "Qwen2_5_VLForConditionalGeneration": ("qwen-image", lambda: Qwen2_5_VLForConditionalGeneration(qwen)),
        "LlamaModel": ("hunyuan-video", lambda: LlamaModel(LlamaConfig(vocab_size=VOCAB,
                                                                       **{**TINY_LLAMA, "intermediate_size": 38}))),
    }
    found = {}
    for name, (family_name, build) in builds.items():
        torch.manual_seed(0)
        found[name] = (build().eval(), family(family_name).text_encoder_splits[name])
    return found


def _embed(encoder: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(2, VOCAB, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return encoder(input_ids=ids, output_hidden_states=True).hidden_states[-1]


def _split_encoders(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh

    from genbatch.parallel.comm import Comm, CommLedger
    from genbatch.parallel.tensor.shard import tensor_parallel

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("group",))
    comm = Comm(mesh.get_group(), CommLedger())
    found = {}
    for name, (encoder, plan) in _encoders().items():
        whole = _embed(encoder)
        tensor_parallel(encoder, plan, comm, mesh)
        found[name] = (float((_embed(encoder) - whole).abs().max()), comm.ledger.take().get("tp_all_reduce", 0))
    return found


def test_split_encoders_give_the_replicated_embeddings():
    for rank, found in enumerate(run_on_ranks(_split_encoders, 2, timeout_s=60)):
        for name, (diff, reduced) in found.items():
            assert diff <= 1e-5, f"rank {rank}: {name} differs by {diff}"
            assert reduced > 0, f"rank {rank}: {name} sent no all-reduce, so nothing was split"


class _Group:
    def __init__(self, size):
        self.size, self.rank = size, 0


def test_a_preset_encoder_a_group_does_not_divide_is_refused_naming_the_fix():
    from genbatch.parallel.tensor.shard import tensor_parallel
    from genbatch.runner.presets import build_preset

    encoder = build_preset("tiny-wan").text_encoder
    with pytest.raises(ValueError, match=r"over the 2 ranks of a job group does not divide UMT5EncoderModel: "
                                         r"encoder.block.0.layer.1.DenseReluDense.wi_0.weight splits \[37\]"):
        tensor_parallel(encoder, family("wan").text_encoder_splits["UMT5EncoderModel"], _Group(2), mesh=None,
                        flag="--text-encoder-parallel tp over the 2 ranks of a job group")


def test_auto_splits_wide_encoders_replicates_narrow_ones_and_leaves_fsdp_its_encoders():
    class Wide:
        config = type("Config", (), {"d_model": 4096})()

    class Narrow:
        config = type("Config", (), {"hidden_size": 768})()

    assert encoders.splits("auto", Wide(), fsdp=False) and not encoders.splits("auto", Narrow(), fsdp=False)
    # under --fsdp a wide encoder is still split, a narrow one sharded
    assert encoders.splits("auto", Wide(), fsdp=True) and not encoders.sharded_by_fsdp("auto", 4096, fsdp=True)
    assert not encoders.splits("auto", Narrow(), fsdp=True) and encoders.sharded_by_fsdp("auto", 768, fsdp=True)
    assert not encoders.sharded_by_fsdp("auto", 768, fsdp=False)
    assert encoders.splits("tp", Narrow(), fsdp=True) and not encoders.sharded_by_fsdp("tp", 768, fsdp=True)
    assert not encoders.splits("replicate", Wide(), fsdp=False)
    with pytest.raises(ValueError, match="add --fsdp"):
        encoders.check_mode("fsdp", fsdp=False)


def test_under_fsdp_auto_reads_each_encoders_width_from_its_saved_config(tmp_path):
    import json

    from genbatch.models.spec import ModelSpec
    from genbatch.models import resolve_model
    from genbatch.parallel.apply import sharded

    for component, config in (("text_encoder", {"hidden_size": 768}), ("text_encoder_2", {"d_model": 4096})):
        (tmp_path / component).mkdir()
        (tmp_path / component / "config.json").write_text(json.dumps(config))
    spec = ModelSpec(**{**{field: getattr(resolve_model("tiny-flux"), field)
                           for field in ModelSpec.__dataclass_fields__}, "path": str(tmp_path)})
    assert encoders.config_width(str(tmp_path), "text_encoder_2") == 4096
    # T5 at 4096 is split, not sharded (a component the pipeline lacks, text_encoder_3 here, is skipped later)
    assert sharded(spec, "auto") == ("transformer", "text_encoder", "text_encoder_3")
    assert sharded(spec, "fsdp") == ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3")
    assert sharded(resolve_model("tiny-flux"), "auto")[1:] == ("text_encoder", "text_encoder_2", "text_encoder_3")


def _pipeline_modes(rank, world_size, out):
    from torch.distributed.tensor import DTensor

    from genbatch.runner.timing import JobTimer
    from tests.support import executor as drive
    from tests.support.runs import job_executor

    with job_executor(f"{out}/replicate", ulysses=2, fsdp=True, text_encoder_parallel="replicate") as (world, ex):
        latents = drive.denoise(ex, WAN, JobTimer(world.ctx.device))
        encoder = ex.model_for(WAN).pipe.text_encoder
        whole = not any(isinstance(param, DTensor) for param in encoder.parameters())
    try:
        with job_executor(f"{out}/tp", ulysses=2, text_encoder_parallel="tp") as (world, ex):
            drive.denoise(ex, WAN, JobTimer(world.ctx.device))
        refused = ""
    except ValueError as error:
        refused = str(error)
    return latents, whole, refused


def test_the_mode_reaches_the_pipeline_replicate_keeps_the_encoder_whole_under_fsdp(references, tmp_path):
    ref_latents, _ = references[WAN.model]
    for rank, (latents, whole, refused) in enumerate(run_on_ranks(_pipeline_modes, 2, args=(str(tmp_path),),
                                                                  timeout_s=60)):
        assert (latents - ref_latents).abs().max() <= 1e-5, rank
        assert whole, f"rank {rank}: --text-encoder-parallel replicate left the text encoder sharded"
        # the preset's UMT5 has an MLP 37 wide: tp over the 2-rank group is refused, naming the fix
        assert "does not divide UMT5EncoderModel" in refused and "choose a degree" in refused, refused
