"""A job as it runs: the validated row (`JobSpec`) plus what its batch's preparation read for it.

`JobSpec` is the manifest row with every setting resolved, and nothing else: what validation built, what the
hand-out passes around and what a failure records. Before a batch's first collective, the executor prepares each
of its rows (`genbatch.runner.prepare`): it reads the row's input images and its adapters' files. A row that
prepared becomes a `PreparedJob`, which the family's hooks, the embedding cache and the checkpoint's fingerprint
read; a row that did not is a `RowFailure` of its batch and runs no further.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from genbatch.jobs.lora import lora_text
from genbatch.jobs.spec import JobSpec

if TYPE_CHECKING:
    from genbatch.io.media_input import MediaInput


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedJob(JobSpec):
    """A `JobSpec` with its inputs read: its media by column, and the sha256 of each of its adapters' files."""

    media: dict[str, MediaInput] = field(default_factory=dict, compare=False, repr=False)
    """The row's input images (column -> `genbatch.io.media_input.MediaInput`), read by this rank."""
    lora_sha256: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The sha256 of each adapter's file, in the row's order (as the group leader read it)."""

    @classmethod
    def of(cls, job: JobSpec, *, media: dict[str, MediaInput] | None = None,
           lora_sha256: tuple[str, ...] = ()) -> PreparedJob:
        """`job` with `media` and `lora_sha256` (a PreparedJob's own are replaced)."""
        values = {spec_field.name: getattr(job, spec_field.name) for spec_field in fields(JobSpec)}
        return cls(**values, media=dict(media or {}), lora_sha256=tuple(lora_sha256))

    def record(self) -> dict[str, object]:
        """`JobSpec.record`, with each adapter's sha256 in its `lora` entry."""
        flat = JobSpec.record(self)
        flat["lora"] = lora_text(self.lora, self.lora_sha256)
        return flat


@dataclass(frozen=True, kw_only=True, slots=True)
class RowFailure:
    """A row of a batch that could not be prepared, as its whole group agreed: it fails alone."""

    job: JobSpec
    """The row's job."""
    column: str | None
    """The manifest column whose value failed (`image`, `lora`, ...); None when no one column is to blame."""
    reason: str
    """What went wrong and the fix, in one line or more (the first line says it)."""
    ranks: tuple[int, ...] = ()
    """The global ranks that saw the failure, when not every rank of the group did (a read that failed on one
    rank); empty when all did."""

    def message(self) -> str:
        """`row R (id X), column C: reason`, naming the ranks that saw it when not all of them did."""
        where = f"row {self.job.row} (id {self.job.id})" + (f", column {self.column!r}" if self.column else "")
        seen = f" (on rank {', '.join(map(str, self.ranks))} of its group)" if self.ranks else ""
        return f"{where}: {self.reason}{seen}"
