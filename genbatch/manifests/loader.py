"""A manifest's rows as jobs: read through fsspec batch by batch, each row resolved or rejected."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from genbatch.jobs.spec import JobOverrides, JobSpec
from genbatch.manifests.reader import DEFAULT_BATCH_ROWS, ManifestReader
from genbatch.manifests.validate import Rejection, RowChecker


@dataclass(kw_only=True, slots=True)
class ManifestJobs:
    """Every row of a manifest, resolved: the jobs to run and the problems of the rows that will not run."""

    jobs: list[JobSpec]
    """The valid rows' jobs, in manifest order."""
    rejected: list[Rejection]
    """One entry per problem of each rejected row, in manifest order."""
    extra_columns: list[str]
    """The manifest's extra columns, in file order (each job's `extra` has exactly these keys)."""
    rows: int
    """Rows in the manifest."""
    extra_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    """The extra columns' Arrow types, so a results table can write them back with the manifest's types."""

    @property
    def rejected_rows(self) -> list[int]:
        """The distinct rejected row indices, in order."""
        return sorted({rejection.row for rejection in self.rejected})


def iter_checked(reader: ManifestReader, overrides: JobOverrides) -> Iterator[JobSpec | list[Rejection]]:
    """Each row of an open manifest, in order: its `JobSpec`, or its list of `Rejection`s."""
    checker = RowChecker(overrides=overrides, extra_columns=reader.schema.extra_columns)
    for first_row, columns in reader.batches():
        yield from checker.check_batch(first_row, columns)


def read_jobs(
    url: str,
    *,
    overrides: JobOverrides,
    storage_options: dict | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> ManifestJobs:
    """Read and resolve a manifest from any fsspec URL.

    Raises `ManifestFileError` (naming the column and the fix) when the file cannot be used at all; rows
    with problems are returned in `rejected` and the others in `jobs`.
    """
    jobs: list[JobSpec] = []
    rejected: list[Rejection] = []
    with ManifestReader(url, storage_options=storage_options, batch_rows=batch_rows) as reader:
        for outcome in iter_checked(reader, overrides):
            if isinstance(outcome, JobSpec):
                jobs.append(outcome)
            else:
                rejected.extend(outcome)
        return ManifestJobs(
            jobs=jobs,
            rejected=rejected,
            extra_columns=list(reader.schema.extra_columns),
            rows=reader.rows,
            extra_schema=reader.schema.extra_schema,
        )
