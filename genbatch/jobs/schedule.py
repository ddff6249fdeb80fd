"""The order jobs are handed out in, and the share of a manifest an array task takes.

Pure functions of the job list: every rank computes the same order from the same jobs.
"""

from __future__ import annotations

from collections.abc import Sequence

from genbatch.jobs.cost import estimated_flops
from genbatch.jobs.spec import JobSpec


def hand_out_order(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """Largest estimated cost first (longest-processing-time order), grouped by model so that each
    group loads each model once; ties broken by manifest row, so the order is deterministic."""
    first_row: dict[str, int] = {}
    for job in jobs:
        first_row.setdefault(job.model, job.row)
    return sorted(jobs, key=lambda job: (first_row[job.model], -estimated_flops(job), job.row))


def select_share(jobs: Sequence[JobSpec], index: int, count: int) -> list[JobSpec]:
    """Share `index` of `count` (0-based): every count-th job of the cost order, so shares get similar
    work. Which share a job belongs to depends only on the manifest, never on what is already done."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"share {index}/{count} is out of range: use 0 <= index < count, e.g. --share 0/{max(count, 1)}")
    return hand_out_order(jobs)[index::count]


def parse_share(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--share {text!r} is not K/N (e.g. --share 0/4 for the first of four shares)") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--share {text!r}: need 0 <= K < N")
    return index, count
