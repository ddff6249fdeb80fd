"""Do the rows' input images exist? Checked by one listing per distinct folder, never one read per row.

`missing_media(urls)` lists each distinct parent folder (or bucket prefix) of the URLs once, through fsspec with
the manifest's storage options, and returns the URLs not found with the reason. A folder that cannot be listed
(permissions, an endpoint down) leaves its URLs unjudged: the rank that reads such an image later names the
problem for its job. `reject_missing` turns a manifest's valid rows with a missing image into rejections.
Whether a file that exists is a decodable image is known only by reading it (`genbatch.io.media_input`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.spec import JobSpec
from genbatch.jobs.table import JobTable
from genbatch.manifests.validate import Rejection

MISSING = "no such file; check the path (a relative one is taken from the manifest's directory)"


def _split(url: str) -> tuple[str, str]:
    parent, _, name = url.rstrip("/").rpartition("/")
    return parent or "/", name


def missing_media(urls: Iterable[str], storage_options: dict | None = None) -> dict[str, str]:
    """URL -> why it is missing, for each of `urls` that its folder's listing does not hold."""
    import fsspec

    folders: dict[str, list[str]] = {}
    for url in set(urls):
        folders.setdefault(_split(url)[0], []).append(url)
    missing = {}
    for folder, members in sorted(folders.items()):
        try:
            fs, root = fsspec.core.url_to_fs(folder, **(storage_options or {}))
            names = {entry.rstrip("/").rpartition("/")[2] for entry in fs.ls(root, detail=False)}
        except FileNotFoundError:
            names = set()
        except Exception:  # noqa: BLE001 - unlisted: the reading rank judges these URLs
            continue
        missing.update({url: MISSING for url in members if _split(url)[1] not in names})
    return missing


def media_rejections(jobs: Iterable[JobSpec], storage_options: dict | None = None) -> dict[int, list[Rejection]]:
    """Manifest row -> its rejections (column, URL), for each of `jobs` that names an image that does not exist."""
    jobs = list(jobs)
    missing = missing_media((getattr(job, column) for job in jobs for column in MEDIA_COLUMNS
                             if getattr(job, column) is not None), storage_options)
    found = {}
    for job in jobs:
        faults = [Rejection(row=job.row, job_id=job.id, column=column, reason=missing[getattr(job, column)],
                            subject=getattr(job, column), model=job.model, extra=job.extra)
                  for column in MEDIA_COLUMNS if getattr(job, column) in missing]
        if faults:
            found[job.row] = faults
    return found


def reject_missing(jobs: JobTable, storage_options: dict | None = None) -> tuple[JobTable, list[Rejection]]:
    """`jobs` without the rows whose image does not exist, and their rejections (`media_rejections`)."""
    table = jobs.table
    names = np.zeros(table.num_rows, dtype=bool)
    for column in MEDIA_COLUMNS:
        if column in table.column_names:
            names |= pc.is_valid(table.column(column)).to_numpy(zero_copy_only=False)
    if not names.any():
        return jobs, []
    found = media_rejections(JobTable(table.take(pa.array(np.flatnonzero(names)))), storage_options)
    if not found:
        return jobs, []
    kept = table.filter(pc.invert(pc.is_in(table.column("row"), value_set=pa.array(list(found), pa.int64()))))
    return JobTable(kept), [rejection for row in sorted(found) for rejection in found[row]]
