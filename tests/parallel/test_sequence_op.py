"""Sequence-parallel attention as a routed call with strategies: key-padding masks, compile, the ledger.

- Key-padding masks, in both forms a model may build them (over this rank's keys, or over the whole
  sequence before the split), give the one-process masked attention under Ulysses 2, Ring 2 and USP 2 x 2.
- `torch.compile(fullgraph=True)` of one tiny Wan block under Ulysses 2 (aot_eager) makes one graph, no
  graph break, with the all-to-alls in the graph as collectives; the ledger counts the same bytes compiled
  as eager, and the output is the eager one.
- On one process, routing leaves every family's transformer output unchanged, `remove()` gives each module
  its own processor back, and a registered strategy takes over every routed module.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genbatch.parallel.attention import masks
from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.strategy import STRATEGIES, ExactAttention, register_strategy
from genbatch.parallel.comm import Comm, CommLedger
from tests.support.distributed import run_on_ranks

TOKENS = (13, 6)  # two streams: 13 "video" tokens, then 6 "text" tokens (the last 4 padding)
HEADS, HEAD_DIM = 4, 8


def _mesh_group(world: int, ulysses: int) -> SequenceGroup:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    ledger = CommLedger()
    whole = Comm(dist.group.WORLD, ledger)
    if ulysses in (1, world):
        solo = Comm(None, ledger)
        return SequenceGroup(ulysses=whole, ring=solo, sp=whole) if ulysses == world else SequenceGroup(
            ulysses=solo, ring=whole, sp=whole
        )
    mesh = init_device_mesh("cpu", (world // ulysses, ulysses), mesh_dim_names=("ring", "ulysses"))
    return SequenceGroup(
        ulysses=Comm(mesh.get_group("ulysses"), ledger), ring=Comm(mesh.get_group("ring"), ledger), sp=whole
    )


def _masked_case(rank: int, world_size: int, ulysses: int) -> dict:
    group = _mesh_group(world_size, ulysses)
    gen = torch.Generator().manual_seed(7)
    total = sum(TOKENS)
    q, k, v = (torch.randn((2, total, HEADS, HEAD_DIM), generator=gen) for _ in range(3))
    full_mask = torch.ones((2, total), dtype=torch.bool)
    full_mask[:, total - 4 :] = False  # text padding at the end of the second stream
    full_mask[1, 5] = False  # and one padded key in the first stream of the second sample
    ref = F.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v)), attn_mask=full_mask[:, None, None, :]
    ).transpose(1, 2)
    # this rank's tokens: its slice of each stream, streams one after the other
    parts = group.size
    stream_layouts = [SequenceLayout.split(n, parts) for n in TOKENS]
    index = masks.rank_order_index(TOKENS, parts)
    layout = SequenceLayout(tuple(sum(s.lengths[r] for s in stream_layouts) for r in range(parts)))
    mine = index[layout.offsets[group.rank] : layout.offsets[group.rank] + layout.lengths[group.rank]]
    shard = [x.index_select(1, mine) for x in (q, k, v)]
    strategy = ExactAttention(group)
    results = {}
    for form, given in (("full", full_mask), ("local", full_mask.index_select(1, mine))):
        mask = masks.key_padding(given[:, None, None, :], 2, "test")  # (b, keys) -> (b, 1, 1, keys) -> (b, keys)
        key_mask = masks.rank_ordered(mask, TOKENS, layout, group.sp, "test")
        out = strategy.attend(*shard, site="test", layout=layout, key_mask=key_mask, scale=None)
        results[form] = (out - ref.index_select(1, mine)).abs().max().item()
    return results


@pytest.mark.parametrize("ulysses", [2, 1], ids=["ulysses2x2", "ring4"])
def test_key_padding_masks_match_one_process(ulysses):
    """USP 2 x 2 (ulysses 2 inside ring 2) and Ring 4, both mask forms: the one-process masked result."""
    for rank, diffs in enumerate(run_on_ranks(_masked_case, world_size=4, args=(ulysses,))):
        for form, diff in diffs.items():
            assert diff < 1e-5, f"rank {rank}, {form} mask: max diff {diff}"


def _ulysses_masked(rank: int, world_size: int) -> dict:
    return _masked_case(rank, world_size, world_size)


def test_key_padding_masks_under_ulysses():
    for rank, diffs in enumerate(run_on_ranks(_ulysses_masked, world_size=2)):
        for form, diff in diffs.items():
            assert diff < 1e-5, f"rank {rank}, {form} mask: max diff {diff}"


def test_masks_that_are_not_key_padding_are_refused():
    with pytest.raises(ValueError, match="boolean key-padding masks.*--ulysses 1 --ring 1"):
        masks.key_padding(torch.zeros((1, 1, 5, 5)), 1, "blocks.0.attn")
    with pytest.raises(ValueError, match="boolean key-padding masks"):
        masks.key_padding(torch.ones((1, 1, 3, 5), dtype=torch.bool), 1, "blocks.0.attn")
    causal = torch.ones((5, 5), dtype=torch.bool).tril()[None, None]  # (1, 1, 5, 5), not one token mask's outer product
    with pytest.raises(ValueError, match="only as the outer product of one per-token mask.*--ulysses 1 --ring 1"):
        masks.key_padding(causal, 1, "blocks.0.attn")
    ledger_free = Comm(None, CommLedger())
    with pytest.raises(ValueError, match="covers 7 keys.*must split every input"):
        masks.rank_ordered(torch.ones((1, 7), dtype=torch.bool), (4, 2), SequenceLayout((6,)), ledger_free, "x")


def _tiny_wan():
    from diffusers import WanTransformer3DModel

    from genbatch.models.tiny_configs import TINY_WAN_TRANSFORMER

    torch.manual_seed(0)
    return WanTransformer3DModel(**TINY_WAN_TRANSFORMER).eval()


def _wan_inputs():
    gen = torch.Generator().manual_seed(1)
    return torch.randn((1, 16, 3, 10, 6), generator=gen), torch.tensor([500]), torch.randn((1, 7, 32), generator=gen)


def _compiled_block(rank: int, world_size: int) -> dict:
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from genbatch.parallel.sequence import SequenceParallel

    model = _tiny_wan()
    ledger = CommLedger()
    whole = Comm(dist.group.WORLD, ledger)
    SequenceParallel(model, SequenceGroup(ulysses=whole, ring=Comm(None, ledger), sp=whole))
    captured = {}
    grab = model.blocks[1].register_forward_pre_hook(
        lambda mod, args, kwargs: captured.update(args=args, kwargs=kwargs), with_kwargs=True
    )
    with torch.no_grad():
        model(*_wan_inputs())
    grab.remove()
    block, args, kwargs = model.blocks[1], captured["args"], captured["kwargs"]
    ledger.take()
    with torch.no_grad():
        eager = block(*args, **kwargs)
    eager_bytes = ledger.take()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    compiled_bytes = []
    with torch.no_grad():
        for _ in range(2):
            out = compiled(*args, **kwargs)
            compiled_bytes.append(ledger.take())
    targets = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": len(graphs),
        "all_to_alls": sum("all_to_all_single" in target for target in targets),
        "eager_bytes": eager_bytes,
        "compiled_bytes": compiled_bytes,
        "diff": (out - eager).abs().max().item(),
    }


def test_compiled_ulysses_block_has_no_graph_break_and_counts_the_same_bytes():
    for rank, result in enumerate(run_on_ranks(_compiled_block, world_size=2, timeout_s=120)):
        assert result["graph_breaks"] == 0 and result["graphs"] == 1, (rank, result)
        assert result["all_to_alls"] == 2, f"q/k/v and the output travel in 2 traced all-to-alls: {result}"
        assert result["eager_bytes"]["all_to_all"] > 0
        assert result["compiled_bytes"] == [result["eager_bytes"]] * 2, (rank, result)
        assert result["diff"] == 0.0, (rank, result)


def _one_rank_group() -> SequenceGroup:
    solo = Comm(None, CommLedger())
    return SequenceGroup(ulysses=solo, ring=solo, sp=solo)


def _family_models():
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from genbatch.models.tiny_configs import TINY_FLUX_TRANSFORMER, TINY_SD3_TRANSFORMER

    torch.manual_seed(0)
    flux = FluxTransformer2DModel(**TINY_FLUX_TRANSFORMER).eval()
    sd3 = SD3Transformer2DModel(**TINY_SD3_TRANSFORMER).eval()
    gen = torch.Generator().manual_seed(3)
    flux_inputs = dict(
        hidden_states=torch.randn((1, 12, 64), generator=gen),
        encoder_hidden_states=torch.randn((1, 5, 32), generator=gen),
        pooled_projections=torch.randn((1, 32), generator=gen),
        timestep=torch.tensor([0.5]),
        img_ids=torch.zeros((12, 3)),
        txt_ids=torch.zeros((5, 3)),
        guidance=torch.tensor([3.5]),
    )
    sd3_inputs = dict(
        hidden_states=torch.randn((1, TINY_SD3_TRANSFORMER["in_channels"], 8, 8), generator=gen),
        encoder_hidden_states=torch.randn((1, 5, TINY_SD3_TRANSFORMER["joint_attention_dim"]), generator=gen),
        pooled_projections=torch.randn((1, TINY_SD3_TRANSFORMER["pooled_projection_dim"]), generator=gen),
        timestep=torch.tensor([500]),
    )
    wan_x, wan_t, wan_text = _wan_inputs()
    return {
        "wan": (_tiny_wan(), dict(hidden_states=wan_x, timestep=wan_t, encoder_hidden_states=wan_text)),
        "flux": (flux, flux_inputs),
        "sd3": (sd3, sd3_inputs),
    }


@pytest.mark.parametrize("family", ["wan", "flux", "sd3"])
def test_routing_keeps_the_output_and_remove_restores_the_processors(family):
    from genbatch.parallel.sequence import SequenceParallel

    model, inputs = _family_models()[family]
    originals = {name: type(m.processor) for name, m in model.named_modules() if hasattr(m, "processor")}
    with torch.no_grad():
        plain = model(**inputs, return_dict=False)[0]
        sp = SequenceParallel(model, _one_rank_group())
        routed = {name for name, m in model.named_modules() if type(getattr(m, "processor", None)).__name__.startswith("SequenceParallel")}
        out = model(**inputs, return_dict=False)[0]
    assert routed, "no attention module was routed"
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
    sp.remove()
    assert {name: type(m.processor) for name, m in model.named_modules() if hasattr(m, "processor")} == originals


def test_a_registered_strategy_takes_over_every_routed_module():
    from genbatch.parallel.sequence import SequenceParallel

    seen = []

    @register_strategy("counting-test")
    class Counting(ExactAttention):
        def attend(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
            seen.append(site)
            return super().attend(q, k, v, site=site, layout=layout, key_mask=key_mask, scale=scale)

    try:
        model, inputs = _family_models()["wan"]
        with torch.no_grad():
            plain = model(**inputs, return_dict=False)[0]
            SequenceParallel(model, _one_rank_group(), strategy="counting-test")
            out = model(**inputs, return_dict=False)[0]
        assert seen == ["blocks.*.attn1"] * 2  # tiny-wan: two blocks, self-attention routed, cross-attention not
        torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="no sequence-parallel attention strategy named 'nope'"):
            SequenceParallel(_tiny_wan(), _one_rank_group(), strategy="nope")
    finally:
        STRATEGIES.pop("counting-test", None)


def test_a_processor_without_an_attention_call_is_refused():
    from genbatch.parallel.attention.route import ProcessorRoutes

    class NoAttention:
        def __call__(self, attn, hidden_states, **kwargs):
            return hidden_states

    module = torch.nn.Module()
    module.processor = NoAttention()
    with pytest.raises(ValueError, match="calls neither diffusers' dispatch_attention_fn nor F.scaled_dot_product"):
        ProcessorRoutes("test").route("blocks.0.attn", module, "key", lambda *a: None)


def test_the_rank_order_index_is_built_once_per_sizes_and_device():
    cpu = torch.device("cpu")
    first = masks.rank_order_index_on((5, 3), 2, cpu)
    assert masks.rank_order_index_on((5, 3), 2, cpu) is first  # every masked attention of a forward shares it
    assert torch.equal(first, masks.rank_order_index((5, 3), 2))
    assert first.tolist() == [0, 1, 2, 5, 6, 3, 4, 7]  # rank 0: stream 0's [0, 3) and stream 1's [5, 7)
    assert masks.rank_order_index_on((6, 3), 2, cpu).tolist() == [0, 1, 2, 6, 7, 3, 4, 5, 8]  # new sizes, new index
