"""Rows batched into one forward (`gen run --batch-size N`): which jobs run together, decided before the hand-out.

Jobs batch together when they agree on everything but the prompt, the negative prompt and the seed: the
`BATCH_KEY` columns (model, sizes, frames, steps, guidance, cache mode, adapter set) and the conditioning kind
(which of the media columns a row fills, and whether it has a negative prompt: Qwen-Image runs its second
guidance branch only for a row with one). The run's dtype and layout are the same for every job.

    batches = form_batches(pending, size=4)   # pending: a JobTable in hand-out order, the same on every rank
    batches[i]                                -> [JobSpec, ...] (at most 4, one key)
    batch_id([job.id for job in batches[i]])  -> '3f0c9a2e71b4' (what the results rows record)

The batches are a pure function of the jobs and `size`. The runner forms them over every job of its share,
done or not (`batch_positions`), and then leaves out the done ones (`kept_starts`): a batch's jobs commit
together, so a rerun, a requeue or a resume after a kill runs the very batches the first attempt formed,
whatever the timing. Within a key, jobs keep their hand-out order except that jobs sharing a
(prompt, negative prompt) are put next to each other, so that they share a batch and its prompt encode. Batches
are handed out in the order of their first job, so the largest-first order of `genbatch.jobs.schedule` holds.
With `size` 1 every job is a batch of its own, in the given order, exactly as without batching.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.spec import JobSpec
from genbatch.jobs.table import JobTable

BATCH_KEY = ("model", "width", "height", "num_frames", "num_inference_steps", "guidance_scale", "cache", "lora")
"""The columns jobs of one batch agree on (with the conditioning kind: which of `KIND_COLUMNS` are filled)."""
KIND_COLUMNS = (*MEDIA_COLUMNS, "negative_prompt")
"""The columns whose presence (not value) jobs of one batch agree on."""
MOST = 256
"""The largest batch size `--batch-size` takes."""


def check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MOST:
        raise ValueError(f"--batch-size {size!r} must be an integer from 1 to {MOST} (or auto), e.g. --batch-size 4")


def parse_size(text: str) -> int | str:
    """`--batch-size`'s text: a whole number from 1 to `MOST`, or `auto`; ValueError naming the fix."""
    if text == "auto":
        return text
    try:
        size = int(text)
        check_size(size)
    except ValueError:
        raise ValueError(f"--batch-size {text!r} is not a batch size: pass a whole number from 1 to {MOST}, or "
                         "auto (e.g. --batch-size 4)") from None
    return size


def batch_id(ids: Sequence[str]) -> str:
    """The batch's name in the results: 12 hex digits of the sha256 of its job ids in batch order."""
    return hashlib.sha256("\0".join(ids).encode()).hexdigest()[:12]


def batch_key(job: JobSpec) -> tuple:
    """What the jobs of one batch agree on (`BATCH_KEY` and the conditioning kind), for one `JobSpec`."""
    return (*(getattr(job, name) for name in BATCH_KEY), *(getattr(job, name) is not None for name in KIND_COLUMNS))


@dataclass(frozen=True, slots=True)
class Batches(Sequence[list[JobSpec]]):
    """Jobs cut into batches: batch i is `jobs[starts[i]:starts[i + 1]]`."""

    jobs: JobTable
    """Every job, in batch order (a batch's jobs next to each other)."""
    starts: np.ndarray
    """Where each batch starts in `jobs`, with `len(jobs)` at the end (int64, one more than the batches)."""

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, index: int) -> list[JobSpec]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        index %= len(self)
        return list(self.jobs.take(np.arange(self.starts[index], self.starts[index + 1])))

    def sizes(self) -> np.ndarray:
        """Each batch's number of jobs."""
        return np.diff(self.starts)

    @classmethod
    def single(cls, jobs: JobTable) -> Batches:
        """Every job a batch of its own, in order."""
        return cls(jobs=jobs, starts=np.arange(len(jobs) + 1, dtype=np.int64))


def _codes(column) -> np.ndarray:
    """A column as int64 codes, equal values (nulls too) sharing one code."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column.combine_chunks(), null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _first_seen(codes: np.ndarray) -> np.ndarray:
    """Each entry's rank by where its code first appears (0 for the first code seen, ...)."""
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.reshape(-1)]


def _combined(columns: list[np.ndarray]) -> np.ndarray:
    """One code per distinct tuple of `columns` (codes of equal length)."""
    if not columns:
        return np.zeros(0, dtype=np.int64)
    _, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def form_batches(jobs: JobTable, size: int) -> Batches:
    """`jobs` (in hand-out order) cut into batches of at most `size` jobs of one key (see the module docstring)."""
    positions, starts = batch_positions(jobs, size)
    return Batches(jobs=jobs.take(positions), starts=starts)


def batch_positions(jobs: JobTable, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`form_batches` as (the positions of `jobs` in batch order, where each batch starts, with the count at the
    end)."""
    import pyarrow.compute as pc

    check_size(size)
    count = len(jobs)
    position = np.arange(count, dtype=np.int64)
    if size == 1 or count <= 1:
        return position, np.arange(count + 1, dtype=np.int64)
    kind = [pc.is_valid(jobs.column(name)).to_numpy(zero_copy_only=False).astype(np.int64) for name in KIND_COLUMNS]
    key = _first_seen(_combined([_codes(jobs.column(name)) for name in BATCH_KEY] + kind))
    prompt = _first_seen(_combined([_codes(jobs.column("prompt")), _codes(jobs.column("negative_prompt"))]))
    order = np.lexsort((position, prompt, key))  # by key, then prompt, then hand-out position
    # a new batch where the key changes, or every `size` jobs of one key
    sorted_key = key[order]
    run_start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    run_of = np.repeat(np.arange(len(run_start)), np.diff(np.r_[run_start, count]))
    starts = np.flatnonzero((position - run_start[run_of]) % size == 0)
    # batches in the order of their first job in the hand-out order
    member = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, count]))
    ranked = np.argsort(np.minimum.reduceat(order, starts), kind="stable")
    rank_of = np.empty_like(ranked)
    rank_of[ranked] = np.arange(len(ranked))
    final = order[np.argsort(rank_of[member], kind="stable")]  # each batch's jobs keep their order
    lengths = np.diff(np.r_[starts, count])[ranked]
    return final, np.r_[0, np.cumsum(lengths)].astype(np.int64)


def kept_starts(starts: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The batch starts once the jobs where `keep` is false are left out (a batch left empty disappears)."""
    if len(keep) == 0:
        return np.zeros(1, dtype=np.int64)
    counts = np.add.reduceat(keep.astype(np.int64), starts[:-1]) if len(starts) > 1 else np.zeros(0, np.int64)
    counts = counts[counts > 0]
    return np.r_[0, np.cumsum(counts)].astype(np.int64)
