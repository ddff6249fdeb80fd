"""`--quantization fp8|int8` on the loaded modules (`genbatch.parallel.quantize`): every targeted Linear layer of
the transformer comes out quantized (and of the text encoders with `--quantize-text-encoder`), none is silently
left as it was, the VAE, norms and the layers a model keeps in fp32 stay in their dtype, and the recorded bytes
are the stored ones. A LoRA switch merges into the dequantized weights, quantizes the sum again in place and
puts the quantized base back bit for bit."""

from __future__ import annotations

import pytest
import torch

from genbatch.jobs.quantization import Quantization, parse_quantization
from genbatch.models import resolve_model
from genbatch.parallel.apply import TEXT_ENCODERS
from genbatch.parallel.quantize import is_quantized, kept_names, quantize, targets, tensor_bytes, weight_bytes
from genbatch.runner.loading import load_pipeline
from tests.support.runs import job, job_executor


def _pipe(preset: str, dtype=torch.float32):
    return load_pipeline(resolve_model(preset), torch.device("cpu"), dtype)


def _linear_names(module) -> set[str]:
    return {name for name, sub in module.named_modules() if isinstance(sub, torch.nn.Linear)}


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_every_targeted_linear_is_quantized_and_the_rest_keeps_its_dtype(kind):
    pipe = _pipe("tiny-wan", torch.bfloat16)
    transformer = pipe.transformer
    vae_before = {name: param.dtype for name, param in pipe.vae.named_parameters()}
    bf16 = sum(tensor_bytes(linear.weight) for _, linear in targets(transformer))
    count = quantize(transformer, kind, torch.device("cpu"))
    targeted = {name for name, _ in targets(transformer)}
    kept = {name for name in _linear_names(transformer) if any(part in kept_names(transformer)
                                                                for part in name.split("."))}
    # every Linear is targeted except those under Wan's fp32 modules (its time embedder)
    assert count == len(targeted) > 10 and targeted == _linear_names(transformer) - kept and kept
    for name, linear in targets(transformer):
        assert is_quantized(linear.weight), name  # a flag that does nothing fails here
    for name in kept:
        assert not is_quantized(transformer.get_submodule(name).weight), name
    for name, sub in transformer.named_modules():  # norms, embeddings and convolutions stay plain
        if not isinstance(sub, torch.nn.Linear):
            assert not any(is_quantized(p) for p in sub.parameters(recurse=False)), name
    assert {name: param.dtype for name, param in pipe.vae.named_parameters()} == vae_before
    assert not any(is_quantized(p) for p in pipe.text_encoder.parameters())  # not asked for
    linear = targets(transformer)[0][1]
    out, width = linear.weight.shape
    assert out * width <= tensor_bytes(linear.weight) < out * width + 8 * out  # 1 byte a value, a scale a row
    # the layers' stored bytes: half of bf16, and a scale a row (rows 48 wide here, so the scales add up to 8%;
    # bench/quantization.py measures a whole ~300M transformer at 0.55x at most)
    assert sum(tensor_bytes(linear.weight) for _, linear in targets(transformer)) <= 0.6 * bf16


def test_a_layer_torchao_leaves_unquantized_fails_the_run_naming_it(monkeypatch):
    import torchao.quantization as api

    transformer = _pipe("tiny-wan").transformer
    skipped, real = transformer.get_submodule("blocks.1.ffn.net.2"), api.quantize_

    def some_layers(module, config, filter_fn=None):  # torchao passing over one layer, as it may do silently
        if module is not skipped:
            real(module, config, filter_fn=filter_fn)

    monkeypatch.setattr(api, "quantize_", some_layers)
    with pytest.raises(RuntimeError, match=r"left 1 Linear layer\(s\) of WanTransformer3DModel unquantized "
                                           r"\(first: blocks.1.ffn.net.2\)"):
        quantize(transformer, "fp8", torch.device("cpu"))


def test_the_quantization_options_are_checked():
    assert parse_quantization(None) == Quantization() and not Quantization().enabled
    assert parse_quantization("int8", True).label == "int8+text-encoders"
    with pytest.raises(ValueError, match="add --quantization fp8 or int8"):
        parse_quantization("none", True)
    with pytest.raises(ValueError, match="choose one of none, fp8, int8"):
        parse_quantization("int4")
    assert Quantization(kind="fp8", text_encoders=True).flags() == ("--quantization", "fp8", "--quantize-text-encoder")


def test_a_run_quantizes_the_transformer_and_with_the_flag_the_text_encoders(tmp_path):
    """Through the runner's loading (`load_for_group`, step 2b): the transformer alone, then with every text
    encoder (tiny-flux has two); the bytes the cache records are the stored ones."""
    plain = job("tiny-flux", num_inference_steps=1)
    with job_executor(str(tmp_path / "a"), quantization="int8") as (world, executor):
        pipe = executor.model_for(plain).pipe
        assert all(is_quantized(linear.weight) for _, linear in targets(pipe.transformer))
        assert not any(is_quantized(p) for name in TEXT_ENCODERS if getattr(pipe, name, None) is not None
                       for p in getattr(pipe, name).parameters())
        recorded = executor.pipelines.weights["tiny-flux"]
        assert recorded["transformer"] == weight_bytes(pipe.transformer)
    with job_executor(str(tmp_path / "b"), quantization="fp8", quantize_text_encoder=True) as (world, executor):
        pipe = executor.model_for(plain).pipe
        for name in ("text_encoder", "text_encoder_2"):
            layers = targets(getattr(pipe, name))
            assert layers and all(is_quantized(linear.weight) for _, linear in layers), name
        both = executor.pipelines.weights["tiny-flux"]
    whole = _pipe("tiny-flux")
    assert recorded["transformer"] < 0.5 * weight_bytes(whole.transformer)  # fp32 on the CPU: about 0.27
    assert both["text_encoders"] < 0.6 * sum(weight_bytes(getattr(whole, name)) for name in ("text_encoder",
                                                                                             "text_encoder_2"))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_a_lora_merges_into_the_dequantized_weights_and_the_base_comes_back_bit_for_bit(kind):
    """`LoraWeights.switch` on a quantized Linear: base + delta is built from the dequantized weight, quantized
    again with the layer's config and written into the same parameter; switching back to no adapter restores the
    quantized base exactly. The delta is rounded with the weight: int8 keeps one of a fifth of the weight within
    5%; fp8's 3-bit mantissa within 20% (a delta of 2% it rounds to noise: docs/quantization.md)."""
    from types import SimpleNamespace

    from genbatch.parallel.lora import LoraLayer, LoraWeights

    torch.manual_seed(0)
    transformer = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    quantize(transformer, kind, torch.device("cpu"))
    pipe, linear = SimpleNamespace(transformer=transformer), transformer[0]
    weight, base = linear.weight, linear.weight.dequantize(torch.float32)
    stored = [part.clone() for part in (weight.qdata, weight.scale)]
    down, up = torch.randn(4, 256), torch.randn(256, 4)
    delta = up @ down
    scale = float(0.2 * base.norm() / delta.norm())  # a delta of a fifth of the weight
    weights = LoraWeights()
    assert weights.switch(pipe, "style", [LoraLayer(component="transformer", module="0", down=down, up=up,
                                                    scale=scale)])
    assert linear.weight is weight and is_quantized(weight)  # the same parameter, still quantized
    applied = weight.dequantize(torch.float32) - base
    error = float((applied - scale * delta).norm() / (scale * delta).norm())
    assert error < (0.05 if kind == "int8" else 0.2), error
    assert 0 < weights.kept_bytes < 256 * 256 + 16 * 256  # the quantized base, at its width
    weights.switch(pipe, None, [])
    assert torch.equal(weight.qdata, stored[0]) and torch.equal(weight.scale, stored[1])


def test_fp8_on_the_cpu_dequantizes_a_block_of_rows_at_a_time_to_torchaos_product(monkeypatch):
    """On the CPU a weight-only fp8 layer runs `RowBlockLinear`: each block is torchao's own dequantization (the
    same values), and the joined product is torchao's whole-weight one; int8 keeps torchao's own Linear."""
    from genbatch.parallel import row_blocks
    from genbatch.parallel.row_blocks import RowBlockLinear

    torch.manual_seed(0)
    layers = {kind: torch.nn.Linear(96, 200, dtype=torch.bfloat16) for kind in ("fp8", "int8")}
    layers["int8"].load_state_dict(layers["fp8"].state_dict())
    for kind, layer in layers.items():
        quantize(torch.nn.Sequential(layer), kind, torch.device("cpu"))
    fp8 = layers["fp8"]
    assert type(fp8) is RowBlockLinear and type(layers["int8"]) is torch.nn.Linear
    assert is_quantized(fp8.weight) and tensor_bytes(fp8.weight) < 96 * 200 + 8 * 200
    monkeypatch.setattr(row_blocks, "BLOCK_VALUES", 96 * 64)  # 4 blocks of 64, 64, 64 and 8 rows
    blocks = torch.cat([fp8.weight[start:start + 64].dequantize() for start in range(0, 200, 64)])
    assert torch.equal(blocks, fp8.weight.dequantize())
    x = torch.randn(3, 5, 96, dtype=torch.bfloat16)
    whole = torch.nn.Linear.forward(fp8, x)  # torchao's path: the whole weight dequantized
    dequantized, dequantize = [], type(fp8.weight).dequantize
    monkeypatch.setattr(type(fp8.weight), "dequantize",
                        lambda self, *args: dequantized.append(self.shape[0]) or dequantize(self, *args))
    by_rows = fp8(x)
    assert dequantized == [64, 64, 64, 8] and by_rows.shape == whole.shape == (3, 5, 200)
    torch.testing.assert_close(by_rows, whole, rtol=1.6e-2, atol=1e-2)  # bf16 products, summed in another order
