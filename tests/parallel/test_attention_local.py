"""local_attention, the online-softmax merge and SequenceLayout, on one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genbatch.parallel.attention import (
    SequenceLayout,
    local_attention,
    merge_attention,
    pick_backend,
    ring_attention,
    ulysses_attention,
    usp_attention,
)
from genbatch.parallel.comm import Comm, CommLedger


def _qkv(b=2, s_q=45, s_k=45, h=4, d=12, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=gen).to(dtype)
    k = torch.randn(b, s_k, h, d, generator=gen).to(dtype)
    v = torch.randn(b, s_k, h, d, generator=gen).to(dtype)
    return q, k, v


def _sdpa(q, k, v, scale=None):
    # (b, s, h, d) -> (b, h, s, d) -> SDPA -> (b, s, h, d)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
    return out.transpose(1, 2)


def _lse(q, k, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    return torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("backend", ["auto", "cpu_flash", "math"])
@pytest.mark.parametrize("shape", [(2, 45, 45, 4, 12), (1, 7, 33, 2, 64), (3, 16, 5, 8, 8), (1, 64, 64, 1, 128)])
@pytest.mark.parametrize("scale", [None, 0.2])
def test_matches_sdpa_and_lse(backend, shape, scale):
    b, s_q, s_k, h, d = shape
    q, k, v = _qkv(b, s_q, s_k, h, d)
    out, lse = local_attention(q, k, v, scale=scale, backend=backend)
    assert out.shape == (b, s_q, h, d) and out.dtype == torch.float32
    assert lse.shape == (b, h, s_q) and lse.dtype == torch.float32
    # as close to the float64 truth as fp32 SDPA itself is (1e-6, or SDPA's own error where that is larger)
    truth = _sdpa(q.double(), k.double(), v.double(), scale)
    sdpa_error = (_sdpa(q, k, v, scale) - truth).abs().max().item()
    assert (out - truth).abs().max() <= max(1e-6, 1.5 * sdpa_error)
    assert (lse.double() - _lse(q, k, scale)).abs().max() <= 1e-5


def test_cpu_picks_the_flash_kernel():
    assert pick_backend(torch.zeros(1, 1, 1, 8)) == "cpu_flash"


def test_bf16_gives_fp32_lse():
    q, k, v = _qkv(dtype=torch.bfloat16)
    out, lse = local_attention(q, k, v)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert (out.float() - _sdpa(q.float(), k.float(), v.float())).abs().max() <= 2e-2
    assert (lse.double() - _lse(q.float(), k.float())).abs().max() <= 2e-2


def test_empty_blocks_are_neutral():
    q, k, v = _qkv(s_q=5, s_k=6)
    out, lse = local_attention(q, k[:, :0], v[:, :0])
    assert torch.equal(out, torch.zeros_like(q)) and bool(torch.isneginf(lse).all())
    out, lse = local_attention(q[:, :0], k, v)
    assert out.shape == (2, 0, 4, 12) and lse.shape == (2, 4, 0)


def test_unknown_backend_is_named():
    q, k, v = _qkv(s_q=2, s_k=2)
    with pytest.raises(ValueError, match="'fast'.*cpu_flash"):
        local_attention(q, k, v, backend="fast")


@pytest.mark.parametrize("cuts", [(20,), (1, 44), (10, 11, 30), (0, 45)])
def test_merging_key_blocks_is_exact(cuts):
    q, k, v = _qkv()
    bounds = [0, *cuts, 45]
    out = lse = None
    for start, stop in zip(bounds, bounds[1:]):
        block_out, block_lse = local_attention(q, k[:, start:stop], v[:, start:stop])
        if out is None:
            out, lse = block_out.clone(), block_lse
        else:
            out, lse = merge_attention(out, lse, block_out, block_lse)
    assert (out - _sdpa(q, k, v)).abs().max() <= 1e-6
    assert (lse.double() - _lse(q, k)).abs().max() <= 1e-5


def test_attention_and_merge_compile_without_graph_breaks():
    def two_blocks(q, k, v):
        out, lse = local_attention(q, k[:, :20], v[:, :20])
        return merge_attention(out.clone(), lse, *local_attention(q, k[:, 20:], v[:, 20:]))[0]

    q, k, v = _qkv()
    compiled = torch.compile(two_blocks, fullgraph=True, backend="eager")
    assert (compiled(q, k, v) - _sdpa(q, k, v)).abs().max() <= 1e-6


def test_layout_split_matches_tensor_split():
    for total, parts in [(45, 4), (45, 2), (3, 4), (64, 8), (0, 2)]:
        layout = SequenceLayout.split(total, parts)
        sizes = tuple(t.shape[0] for t in torch.tensor_split(torch.arange(total), parts))
        assert layout.lengths == sizes and layout.total == total and layout.parts == parts


def test_layout_shard_rows_and_offsets():
    layout = SequenceLayout([12, 11, 11, 11])
    assert layout.lengths == (12, 11, 11, 11) and layout.offsets == (0, 12, 23, 34)
    x = torch.arange(45).view(1, 45)
    assert torch.equal(torch.cat([layout.shard(x, r) for r in range(4)], dim=1), x)
    assert layout.row(1, 2).lengths == (11, 11) and layout.rows(2).lengths == (23, 22)
    assert layout.rows(1) == layout and layout.rows(4).lengths == (45,)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SequenceLayout(()), "one length per rank"),
        (lambda: SequenceLayout((3, -1)), r"\(3, -1\)"),
        (lambda: SequenceLayout((3, 1.5)), "non-negative ints"),
        (lambda: SequenceLayout.split(4, 0), "4 tokens into 0 parts"),
        (lambda: SequenceLayout((1, 2, 3)).rows(2), "groups of 2"),
        (lambda: SequenceLayout((1, 2)).check(3, 0, 1, "x"), "2 lengths but the group has 3"),
        (lambda: SequenceLayout((1, 2)).check(2, 1, 1, "x"), "rank 1 holds 1 tokens.*gives it 2"),
    ],
)
def test_layout_errors_name_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_groups_of_one_are_local_attention_and_send_nothing():
    q, k, v = _qkv()
    ledger = CommLedger()
    solo, layout = Comm(None, ledger), SequenceLayout((45,))
    expected = local_attention(q, k, v)[0]
    for out in (
        ulysses_attention(q, k, v, solo, layout),
        ring_attention(q, k, v, solo, layout),
        usp_attention(q, k, v, solo, solo, layout),
    ):
        assert torch.equal(out, expected)
    assert ledger.total() == 0


@pytest.mark.parametrize("attention", [ulysses_attention, ring_attention])
def test_mismatched_qkv_are_refused(attention):
    q, k, v = _qkv(s_q=45, s_k=20)
    with pytest.raises(ValueError, match=r"\(2, 45, 4, 12\).*\(2, 20, 4, 12\).*call local_attention"):
        attention(q, k, v, Comm(None, CommLedger()), SequenceLayout((45,)))
