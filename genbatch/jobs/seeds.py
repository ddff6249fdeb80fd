"""The seed rule: a row's own `seed` when it has one, else a stable hash of its `id`.

A derived seed is the first 8 bytes of ``sha256(id.encode("utf-8"))`` read as a big-endian unsigned integer
and masked to 63 bits, so it is a non-negative int64 (it fits the results table's int64 `seed` column and
``torch.Generator.manual_seed``). It depends on the id alone: the same row gets the same seed in every
process, on every machine, in every run, whatever the row's position in the manifest or the parallel layout.

A row with `num_outputs` K > 1 makes K jobs, `<id>-0` to `<id>-(K-1)`: output k runs with the row's `seed`
plus k, or, without a seed, with the hash of its own id `<id>-k` (`output_seed`).

    >>> seed_from_id("cat-001")
    2771272577348618636
"""

from __future__ import annotations

import hashlib

SEED_BITS = 63
"""Derived seeds are masked to this many bits: non-negative and inside int64."""
SEED_MASK = (1 << SEED_BITS) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def seed_from_id(job_id: str) -> int:
    """The seed derived from a job id: sha256 of its UTF-8 bytes, first 8 bytes big-endian, masked to 63 bits."""
    digest = hashlib.sha256(job_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & SEED_MASK


def job_seed(seed: int | None, job_id: str) -> int:
    """The seed a job runs with: its own `seed` when given, else `seed_from_id(job_id)`."""
    if seed is None:
        return seed_from_id(job_id)
    if not INT64_MIN <= seed <= INT64_MAX:
        raise ValueError(f"seed {seed} of job {job_id!r} does not fit in int64; use a value in [0, 2**63)")
    return seed


def output_seed(seed: int | None, job_id: str, k: int) -> int:
    """The seed of output `k` of a row (`job_id` being that output's own id, `<row id>-k`): the row's `seed`
    plus k, else `seed_from_id(job_id)`."""
    return job_seed(None if seed is None else seed + k, job_id)


def row_seed_problem(seed: int | None) -> str | None:
    """Why a row's own `seed` cannot be used (None: null, or it fits in int64)."""
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        return f"{seed} does not fit in int64; use a seed in [0, 2**63) or leave it null"
    return None
