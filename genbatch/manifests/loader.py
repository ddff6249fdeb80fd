"""A manifest's rows as jobs: read through fsspec batch by batch, each batch checked column-wise.

The valid rows become one table of resolved columns (`genbatch.jobs.table.JobTable`: a `JobSpec` is built
only for a job that is looked at), one row per job (a row's `num_outputs` makes several, `outputs`), the
others `Rejection`s. Duplicate ids, and ids `num_outputs` derives that another row has, are found from the id
and `num_outputs` columns, read first on their own (`id_space`); everything else is checked one record batch
at a time (`columns.ColumnChecker`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from genbatch.jobs.media import manifest_base
from genbatch.jobs.schedule import SpecOf
from genbatch.jobs.spec import JobOverrides, JobSpec
from genbatch.jobs.table import JobTable
from genbatch.jobs.inputs import num_outputs as outputs
from genbatch.manifests import id_space
from genbatch.manifests.columns import ColumnChecker, first_uses
from genbatch.manifests.reader import DEFAULT_BATCH_ROWS, ManifestReader
from genbatch.manifests.validate import Rejection
from genbatch.models import resolve_model


@dataclass(kw_only=True, slots=True)
class ManifestJobs:
    """Every row of a manifest, resolved: the jobs to run and the problems of the rows that will not run."""

    jobs: JobTable
    """The valid rows' jobs, in manifest order (a sequence of `JobSpec`, built on access): one per row, or
    one per output of a row's `num_outputs`."""
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


def checked_batches(reader: ManifestReader, overrides: JobOverrides,
                    spec_of: SpecOf = resolve_model) -> Iterator[tuple[pa.RecordBatch, list[Rejection]]]:
    """Each record batch of an open manifest, checked: (its valid rows' resolved columns, its rejections); `spec_of`
    resolves the models rows name."""
    ids = reader.column("id")
    collisions = {}
    if outputs.COLUMN in reader.schema.columns:
        counts, _ = outputs.output_counts(reader.column(outputs.COLUMN), reader.rows)
        collisions = id_space.collisions(ids, counts)
    checker = ColumnChecker(
        overrides=overrides, extra_columns=reader.schema.extra_columns, first_use=first_uses(ids),
        media_base=manifest_base(reader.url), collisions=collisions, spec_of=spec_of,
    )
    first = 0
    for batch in reader.record_batches():
        yield checker.check(first, batch)
        first += batch.num_rows


def iter_checked(reader: ManifestReader, overrides: JobOverrides,
                 spec_of: SpecOf = resolve_model) -> Iterator[tuple[JobSpec, ...] | list[Rejection]]:
    """Each row of an open manifest, in order: its jobs (a tuple of `JobSpec`: one, or one per output of its
    `num_outputs`), or its list of `Rejection`s; `spec_of` resolves the models rows name."""
    for accepted, rejected in checked_batches(reader, overrides, spec_of):
        jobs = iter(JobTable(pa.Table.from_batches([accepted])))
        rows = Counter(accepted.column("row").to_pylist())  # a row's jobs are consecutive
        by_row: dict[int, list[Rejection]] = {}
        for rejection in rejected:
            by_row.setdefault(rejection.row, []).append(rejection)
        for row in sorted([*rows, *by_row]):
            yield by_row[row] if row in by_row else tuple(next(jobs) for _ in range(rows[row]))


def read_jobs(
    url: str,
    *,
    overrides: JobOverrides,
    storage_options: dict | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    check_media: bool = True,
    media_policy=None,
) -> ManifestJobs:
    """Read and resolve a manifest from any fsspec URL.

    Raises `ManifestFileError` (naming the column and the fix) when the file cannot be used at all; rows
    with problems are returned in `rejected` and the others in `jobs`.
    """
    batches: list[pa.RecordBatch] = []
    rejected: list[Rejection] = []
    with ManifestReader(url, storage_options=storage_options, batch_rows=batch_rows) as reader:
        for accepted, problems in checked_batches(reader, overrides):
            batches.append(accepted)
            rejected.extend(problems)
        extra_schema = reader.schema.extra_schema
        jobs = JobTable(pa.Table.from_batches(batches)) if batches else JobTable.empty(extra_schema)
        if check_media:  # a row whose image does not exist is rejected alone (one listing per folder)
            from genbatch.io.media_policy import MediaPolicy
            from genbatch.manifests.media_check import reject_missing

            jobs, missing = reject_missing(jobs, storage_options, media_policy or MediaPolicy.for_manifest(url))
            rejected = sorted(rejected + missing, key=lambda rejection: rejection.row) if missing else rejected
        return ManifestJobs(
            jobs=jobs,
            rejected=rejected,
            extra_columns=list(reader.schema.extra_columns),
            rows=reader.rows,
            extra_schema=extra_schema,
        )
