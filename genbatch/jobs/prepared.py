"""A job as it runs: the validated row (`JobSpec`) plus what its batch's preparation read for it.

`JobSpec` is the manifest row with every setting resolved, and nothing else: what validation built, what the
hand-out passes around and what a failure records. Before a batch's first collective, the executor prepares each
of its rows' inputs (`genbatch.runner.prepare`, each input as its declaration says: `genbatch.jobs.inputs`): it
reads the row's input images and its adapters' files. A row that prepared becomes a `PreparedJob`, which the
family's hooks, the embedding cache and the checkpoint's fingerprint read; a row that did not is a `RowFailure`
of its batch and runs no further.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from genbatch.jobs.spec import JobSpec

if TYPE_CHECKING:
    from genbatch.io.media_input import MediaInput


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedJob(JobSpec):
    """A `JobSpec` with what its batch's preparation made of its inputs, by input name
    (`genbatch.jobs.inputs`): the `media` input's images by column, the `lora` input's files' sha256."""

    prepared: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)
    """Each prepared input's value for this row, by the input's name (an input with nothing to prepare, or
    nothing to prepare for this row, is absent)."""

    @classmethod
    def of(cls, job: JobSpec, prepared: Mapping[str, object] | None = None, *,
           media: dict[str, MediaInput] | None = None, lora_sha256: tuple[str, ...] = ()) -> PreparedJob:
        """`job` with its inputs' prepared values (`prepared`, or for the two inputs prepared today, `media`
        and `lora_sha256`)."""
        values = {spec_field.name: getattr(job, spec_field.name) for spec_field in fields(JobSpec)}
        found = dict(prepared or {})
        if media:
            found["media"] = dict(media)
        if lora_sha256:
            found["lora"] = tuple(lora_sha256)
        return cls(**values, prepared=found)

    @property
    def media(self) -> dict[str, MediaInput]:
        """The row's input images, by column (`image`, `last_image`), as this rank read them."""
        return self.prepared.get("media", {})

    @property
    def lora_sha256(self) -> tuple[str, ...]:
        """The sha256 of each of the row's adapters' files, in its order (as the group leader read them)."""
        return self.prepared.get("lora", ())

    def record(self) -> dict[str, object]:
        """`JobSpec.record`, with what each input records of its prepared value (its files' sha256)."""
        from genbatch.jobs.inputs import ROW_INPUTS

        flat = JobSpec.record(self)
        for row_input in ROW_INPUTS:
            flat.update(row_input.prepared_record(self))
        return flat

    def fingerprint(self, *, shaping_encode: bool = False) -> dict[str, object]:
        """What each input adds to the job's checkpoint fingerprint (`shaping_encode`: only the inputs the prompt
        encode depends on, for the embedding cache's key)."""
        from genbatch.jobs.inputs import ROW_INPUTS

        found: dict[str, object] = {}
        for row_input in ROW_INPUTS:
            if row_input.shapes_encode or not shaping_encode:
                found.update(row_input.fingerprint(self))
        return found


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
