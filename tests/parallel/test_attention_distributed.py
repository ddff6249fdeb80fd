"""Ulysses, Ring and USP on 2 and 4 gloo processes against one-process SDPA on the full sequence, and the
bytes each rank sends against seed 000's formulas; the same with a prefix every rank keeps whole
(`prefix_attention`, Qwen-Image 2.1's kept prefix), its padded keys masked, and its bytes never sent.

Each world size is launched once (a launch costs seconds of imports) and runs every case; the tests then
check each case's result, so a failure names its case.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from genbatch.parallel.attention import SequenceLayout, ring_attention, ulysses_attention, usp_attention
from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.prefix import prefix_attention
from genbatch.parallel.comm import Comm, CommLedger
from tests.support.distributed import run_on_ranks


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    name: str
    """Test id."""
    ulysses: int = 1
    """Ulysses degree U."""
    ring: int = 1
    """Ring degree R (U x R is the world size of the case)."""
    tokens: int = 48
    """Full sequence length N."""
    heads: int = 4
    head_dim: int = 8
    batch: int = 2
    dtype: str = "float32"
    scale: float | None = None
    layout: tuple[int, ...] | None = None
    """Shard lengths; None splits N as torch.tensor_split does."""
    error: str | None = None
    """A ValueError message every rank must raise (regex)."""
    prefix: int = 0
    """Tokens of a prefix every rank holds whole, before the split ones (`prefix_attention`); 0: none."""
    padded: int = 0
    """Prefix keys masked as padding at the end of the second batch row's prefix."""

    @property
    def world(self) -> int:
        return self.ulysses * self.ring

    @property
    def kind(self) -> str:
        return "usp" if self.ulysses > 1 and self.ring > 1 else "ulysses" if self.ulysses > 1 else "ring"

    @property
    def shards(self) -> SequenceLayout:
        return SequenceLayout(self.layout) if self.layout else SequenceLayout.split(self.tokens, self.world)


CASES = [
    Case(name="u2-even", ulysses=2, tokens=48),
    Case(name="u2-uneven-45", ulysses=2, tokens=45, head_dim=12),
    Case(name="u2-d64-scale", ulysses=2, tokens=33, heads=2, head_dim=64, scale=0.2),
    Case(name="u2-lopsided", ulysses=2, tokens=45, layout=(40, 5)),
    Case(name="r2-even", ring=2, tokens=48),
    Case(name="r2-uneven-45", ring=2, tokens=45, heads=3, head_dim=12),
    Case(name="r2-d64-scale", ring=2, tokens=33, heads=2, head_dim=64, scale=0.2),
    Case(name="r2-lopsided", ring=2, tokens=45, layout=(5, 40)),
    Case(name="u2-bf16", ulysses=2, tokens=45, head_dim=16, dtype="bfloat16"),
    Case(name="r2-bf16", ring=2, tokens=45, head_dim=16, dtype="bfloat16"),
    Case(name="u4-even", ulysses=4, tokens=64),
    Case(name="u4-uneven-45", ulysses=4, tokens=45, heads=8, head_dim=12),
    Case(name="u4-d64", ulysses=4, tokens=45, head_dim=64),
    Case(name="r4-even", ring=4, tokens=64, heads=2),
    Case(name="r4-uneven-45", ring=4, tokens=45, heads=3, head_dim=12),
    Case(name="u2r2-even", ulysses=2, ring=2, tokens=64),
    Case(name="u2r2-uneven-45", ulysses=2, ring=2, tokens=45, head_dim=12),
    Case(name="u2r2-d64-scale", ulysses=2, ring=2, tokens=45, heads=2, head_dim=64, scale=0.2),
    Case(name="u2r2-bf16", ulysses=2, ring=2, tokens=45, head_dim=16, dtype="bfloat16"),
    Case(name="u4-3-tokens", ulysses=4, tokens=3),
    Case(name="r4-3-tokens", ring=4, tokens=3),
    Case(name="u2r2-3-tokens", ulysses=2, ring=2, tokens=3),
    Case(name="u2r2-empty-row", ulysses=2, ring=2, tokens=9, layout=(0, 0, 4, 5)),
    Case(name="u2-prefix-uneven-padded", ulysses=2, tokens=45, prefix=13, padded=4),
    Case(name="r2-prefix-uneven-padded", ring=2, tokens=45, heads=3, prefix=13, padded=4),
    Case(name="r2-prefix-lopsided", ring=2, tokens=45, layout=(40, 5), prefix=7),
    Case(name="u2r2-prefix-uneven-padded", ulysses=2, ring=2, tokens=45, prefix=11, padded=3),
    Case(name="r4-prefix-3-tokens", ring=4, tokens=3, prefix=5, padded=2),
    Case(name="u2-bad-heads", ulysses=2, heads=3, error=r"Ulysses degree 2 does not divide the 3 .*\[1, 3\]"),
    Case(name="u4-bad-heads", ulysses=4, heads=6, error=r"Ulysses degree 4 .* 6 attention heads.*\[1, 2, 3, 6\]"),
    Case(name="u2r2-bad-heads", ulysses=2, ring=2, heads=5, error=r"degree 2 does not divide the 5"),
    Case(name="r2-bad-layout", ring=2, tokens=45, layout=(15, 15, 15), error="3 lengths but the group has 2"),
]
EXACT = [c for c in CASES if c.error is None]


def _inputs(case: Case, index: int):
    gen = torch.Generator().manual_seed(1000 + index)
    shape = (case.batch, case.tokens, case.heads, case.head_dim)
    q, k, v = (torch.randn(shape, generator=gen).to(getattr(torch, case.dtype)) for _ in range(3))
    prefix_shape = (case.batch, case.prefix, case.heads, case.head_dim)
    prefix_k, prefix_v = (torch.randn(prefix_shape, generator=gen).to(q.dtype) for _ in range(2))
    prefix_mask = torch.ones(case.batch, case.prefix, dtype=torch.bool)
    prefix_mask[-1, case.prefix - case.padded:] = False
    # one-process reference in fp32 on the same (possibly bf16-rounded) values over [prefix, every split token]:
    # (b, S, h, d) -> (b, h, S, d); a padded prefix's mask (b, P + S) -> (b, 1, 1, P + S)
    keys, values = torch.cat([prefix_k, k], dim=1), torch.cat([prefix_v, v], dim=1)
    mask = None
    if case.padded:
        mask = torch.cat([prefix_mask, torch.ones(case.batch, case.tokens, dtype=torch.bool)], dim=1)[:, None, None]
    ref = F.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (q, keys, values)), attn_mask=mask, scale=case.scale
    ).transpose(1, 2)
    return q, k, v, ref, (prefix_k, prefix_v, prefix_mask if case.padded else None)


def _groups(world: int, ulysses: int):
    """(ulysses group, ring group, ring rank, ulysses rank) of this process, Ulysses ranks contiguous."""
    from torch.distributed.device_mesh import init_device_mesh

    if ulysses in (1, world):
        sp_rank = dist.get_rank()
        whole, solo = dist.group.WORLD, None
        return (whole, solo, 0, sp_rank) if ulysses == world else (solo, whole, sp_rank, 0)
    mesh = init_device_mesh("cpu", (world // ulysses, ulysses), mesh_dim_names=("ring", "ulysses"))
    return mesh.get_group("ulysses"), mesh.get_group("ring"), mesh["ring"].get_local_rank(), mesh[
        "ulysses"
    ].get_local_rank()


def _run_case(case: Case, index: int, groups) -> dict:
    ulysses_group, ring_group, ring_rank, ulysses_rank = groups
    ulysses, ring = Comm(ulysses_group, CommLedger()), Comm(ring_group, CommLedger())
    q, k, v, ref, (prefix_k, prefix_v, prefix_mask) = _inputs(case, index)
    layout = case.shards
    sp_rank = min(ring_rank * case.ulysses + ulysses_rank, layout.parts - 1)
    shard = [layout.shard(x, sp_rank) for x in (q, k, v)]
    try:
        if case.prefix:
            group = SequenceGroup(ulysses=ulysses, ring=ring, sp=Comm(dist.group.WORLD, CommLedger()))
            out = prefix_attention(*shard, prefix_k, prefix_v, group, layout, prefix_mask=prefix_mask,
                                   scale=case.scale)
        elif case.kind == "ulysses":
            out = ulysses_attention(*shard, ulysses, layout, scale=case.scale)
        elif case.kind == "ring":
            out = ring_attention(*shard, ring, layout, scale=case.scale)
        else:
            out = usp_attention(*shard, ulysses, ring, layout, scale=case.scale)
    except ValueError as exc:
        return {"error": str(exc)}
    return {
        "error": None,
        "shape_ok": out.shape == shard[0].shape and out.dtype == q.dtype,
        "diff": (out.float() - layout.shard(ref, sp_rank)).abs().max().item() if out.numel() else 0.0,
        "ulysses": ulysses.ledger.take(),
        "ring": ring.ledger.take(),
    }


def _run_cases(rank: int, world_size: int, cases: list[Case]) -> dict:
    results, groups = {}, {}
    for index, case in enumerate(CASES):
        if case in cases:
            if case.ulysses not in groups:
                groups[case.ulysses] = _groups(world_size, case.ulysses)
            results[case.name] = _run_case(case, index, groups[case.ulysses])
    return results


@pytest.fixture(scope="module")
def ranks():
    """Every case's result on every rank: {world size: [rank results]}."""
    return {
        world: run_on_ranks(_run_cases, world, ([c for c in CASES if c.world == world],), timeout_s=20)
        for world in (2, 4)
    }


def _results(ranks, case: Case) -> list[dict]:
    per_rank = [result[case.name] for result in ranks[case.world]]
    for result in per_rank:
        assert result["error"] is None, result["error"]
    return per_rank


@pytest.mark.parametrize("case", EXACT, ids=lambda c: c.name)
def test_matches_one_process_attention(ranks, case):
    tolerance = 1e-5 if case.dtype == "float32" else 3e-2  # bf16 smoke: rounding of the output itself
    for rank, result in enumerate(_results(ranks, case)):
        assert result["shape_ok"], f"rank {rank}: wrong output shape or dtype"
        assert result["diff"] <= tolerance, f"rank {rank}: max abs diff {result['diff']:.3g}"


def _formula_bytes(case: Case) -> tuple[Fraction, Fraction]:
    """Seed 000, per rank per attention layer: Ulysses 4 (U-1)/U^2 * N * d on its group (the row's N/R
    tokens), Ring 2 (R-1)/R * N * d on its group (d/U channels after the Ulysses split); x batch x bytes."""
    u, r, n = case.ulysses, case.ring, case.tokens
    d_bytes = case.heads * case.head_dim * case.batch * torch.tensor([], dtype=getattr(torch, case.dtype)).element_size()
    ulysses = Fraction(4 * (u - 1), u * u) * Fraction(n, r) * d_bytes
    ring = Fraction(2 * (r - 1), r) * n * Fraction(d_bytes, u)
    return ulysses, ring


@pytest.mark.parametrize("case", EXACT, ids=lambda c: c.name)
def test_bytes_match_seed_formulas(ranks, case):
    per_rank = _results(ranks, case)
    formula = dict(zip(("ulysses", "ring"), _formula_bytes(case)))
    kinds = {"ulysses": "all_to_all", "ring": "p2p"}
    for group, expected in formula.items():
        sent = [result[group] for result in per_rank]
        # only the collective that algorithm uses, and never a gather of the whole K/V
        assert all(set(s) <= {kinds[group]} for s in sent), sent
        measured = [s.get(kinds[group], 0) for s in sent]
        # summed over ranks the count equals the formula exactly, even for uneven shards
        assert sum(measured) == expected * case.world, (group, measured, expected)
        if min(case.shards.lengths) * case.world >= 0.9 * case.tokens:  # near-even shards: each rank within 5%
            for rank, value in enumerate(measured):
                assert abs(value - expected) <= Fraction(5, 100) * expected, (group, rank, value, expected)


@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.name)
def test_bad_inputs_raise_on_every_rank(ranks, case):
    import re

    for rank, result in enumerate(ranks[case.world]):
        message = result[case.name]["error"]
        assert message is not None and re.search(case.error, message), f"rank {rank}: {message!r}"
