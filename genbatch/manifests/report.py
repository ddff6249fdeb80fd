"""`validate_manifest`: every problem of a manifest, counted, as text or JSON, with `gen validate`'s exit status."""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.jobs.counts import counted
from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.schedule import SpecOf
from genbatch.jobs.spec import JobOverrides, JobSpec
from genbatch.manifests.causes import cause_lines
from genbatch.manifests.loader import iter_checked
from genbatch.manifests.preflight import RunOptionError, check_options, check_rows_have_model
from genbatch.manifests.reader import DEFAULT_BATCH_ROWS, ManifestReader
from genbatch.manifests.schema import ManifestFileError
from genbatch.manifests.validate import Rejection
from genbatch.models import resolve_model_or_published
from genbatch.jobs import exit_codes


@dataclass(kw_only=True, slots=True)
class ModelCounts:
    """Rows of one model."""

    valid: int = 0
    """Rows that will run."""
    rejected: int = 0
    """Rows rejected."""


@dataclass(kw_only=True, slots=True)
class ValidationReport:
    """What `gen validate` found in one manifest."""

    url: str
    """The manifest's URL."""
    rows: int = 0
    """Rows in the manifest (0 when it could not be read)."""
    valid: int = 0
    """Rows that resolve to jobs."""
    jobs: int = 0
    """The jobs the valid rows make: one per row, or one per output of a row's `num_outputs`."""
    rejected: int = 0
    """Rows rejected (each with one or more problems)."""
    problems: list[Rejection] = field(default_factory=list)
    """Every problem of every rejected row, in manifest order."""
    by_model: dict[str, ModelCounts] = field(default_factory=dict)
    """Valid and rejected rows per model, in order of first appearance."""
    extra_columns: list[str] = field(default_factory=list)
    """The extra columns carried into results."""
    file_error: ManifestFileError | None = None
    """Set when the manifest cannot be read at all; then nothing else is filled."""
    option_error: RunOptionError | None = None
    """Set when a run-level option cannot work for any row (`--model`, a size); then no row is checked."""

    @property
    def exit_code(self) -> int:
        """2 for a file-level or run-level error, 1 when rows are rejected, 0 when every row is valid."""
        if self.file_error is not None or self.option_error is not None:
            return exit_codes.USAGE
        return exit_codes.JOBS_FAILED if self.rejected else exit_codes.OK

    def lines(self) -> list[str]:
        """The report as text: one line per cause (with its row count and first rows), then the summary."""
        if self.file_error is not None:
            return [f"error: {self.file_error}"]
        if self.option_error is not None:
            return [f"error: {self.option_error}"]
        lines = cause_lines(self.problems)
        lines.append(
            f"{self.url}: {counted(self.rows, 'row')}, {self.valid} valid, {self.rejected} rejected"
            + (f" ({counted(len(self.problems), 'problem')})" if self.problems else "")
            + (f"; num_outputs: {counted(self.valid, 'valid row')} -> {counted(self.jobs, 'job')}"
               if self.jobs != self.valid else "")
        )
        for model, counts in self.by_model.items():
            lines.append(f"  {model}: {counts.valid} valid, {counts.rejected} rejected")
        lines.append("extra columns: " + (", ".join(self.extra_columns) or "none"))
        return lines

    def to_json(self) -> dict:
        """The report as JSON-ready data."""
        error = self.file_error
        return {
            "url": self.url,
            "rows": self.rows,
            "valid": self.valid,
            "jobs": self.jobs,
            "rejected": self.rejected,
            "problems": [
                {"row": p.row, "id": p.job_id, "column": p.column, "reason": p.full_reason, "model": p.model}
                for p in self.problems
            ],
            "by_model": {model: {"valid": c.valid, "rejected": c.rejected} for model, c in self.by_model.items()},
            "extra_columns": self.extra_columns,
            "file_error": None if error is None else {"message": str(error), "column": error.column},
            "option_error": None if self.option_error is None else {
                "message": str(self.option_error), "option": self.option_error.option},
            "exit_code": self.exit_code,
        }


def validate_manifest(
    url: str,
    *,
    overrides: JobOverrides | None = None,
    storage_options: dict | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    check_media: bool = True,
    media_policy=None,
    spec_of: SpecOf = resolve_model_or_published,
) -> ValidationReport:
    """Check every row of a manifest without keeping its jobs: memory grows with the problems (and the rows
    that name images), not the rows.

    Run-level options are checked first (see `genbatch.manifests.preflight`): one that cannot work for any
    row is reported alone, as `option_error`, and no row is checked. `check_media`: the rows' images must
    exist (one listing per distinct folder, `genbatch.manifests.media_check`). `spec_of` resolves the models: by
    default a published model missing from the Hugging Face cache is checked against its published configs, which
    give the spec its own would (`genbatch.models.resolve_model_or_published`)."""
    overrides = overrides or JobOverrides()
    report = ValidationReport(url=str(url))
    try:
        check_options(overrides, spec_of)
        with ManifestReader(url, storage_options=storage_options, batch_rows=batch_rows) as reader:
            check_rows_have_model(reader, overrides)
            report.rows = reader.rows
            report.extra_columns = list(reader.schema.extra_columns)
            with_media = []  # the valid rows that name images (their jobs): checked together at the end
            for outcome in iter_checked(reader, overrides, spec_of):
                if isinstance(outcome, tuple):
                    job = outcome[0]
                    report.valid += 1
                    report.jobs += len(outcome)
                    report.by_model.setdefault(job.model, ModelCounts()).valid += 1
                    named = job.lora or any(getattr(job, column) is not None for column in MEDIA_COLUMNS)
                    if check_media and named:
                        with_media.append(outcome)
                else:
                    report.rejected += 1
                    report.problems.extend(outcome)
                    report.by_model.setdefault(outcome[0].model or "?", ModelCounts()).rejected += 1
            if with_media:
                from genbatch.io.media_policy import MediaPolicy

                policy = media_policy or MediaPolicy.for_manifest(str(url))
                _reject_missing_media(report, with_media, storage_options, policy)
    except ManifestFileError as error:
        return ValidationReport(url=str(url), file_error=error)
    except RunOptionError as error:
        return ValidationReport(url=str(url), option_error=error)
    return report


def _reject_missing_media(report: ValidationReport, rows: list[tuple[JobSpec, ...]], storage_options: dict | None,
                          policy) -> None:
    """Move the rows among `rows` (each its jobs) whose image is refused by `policy` or does not exist from
    valid to rejected, one problem per column."""
    from genbatch.manifests.media_check import media_rejections

    found = media_rejections([jobs[0] for jobs in rows], storage_options, policy)
    for jobs in rows:
        job = jobs[0]
        faults = found.get(job.row)
        if not faults:
            continue
        report.valid -= 1
        report.jobs -= len(jobs)
        report.rejected += 1
        counts = report.by_model[job.model]
        counts.valid -= 1
        counts.rejected += 1
        report.problems.extend(faults)
    report.problems.sort(key=lambda problem: problem.row)
