"""genbatch.manifests: the Parquet manifest (v1), its validation, and reading it through fsspec."""

from genbatch.manifests.loader import ManifestJobs, iter_checked, read_jobs
from genbatch.manifests.reader import ManifestReader
from genbatch.manifests.report import ValidationReport, validate_manifest
from genbatch.manifests.schema import COLUMNS, MANIFEST_VERSION, ManifestFileError, ManifestSchema
from genbatch.manifests.validate import Rejection

__all__ = [
    "COLUMNS",
    "MANIFEST_VERSION",
    "ManifestFileError",
    "ManifestJobs",
    "ManifestReader",
    "ManifestSchema",
    "Rejection",
    "ValidationReport",
    "iter_checked",
    "read_jobs",
    "validate_manifest",
]
