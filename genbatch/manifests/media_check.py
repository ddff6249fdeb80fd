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

from genbatch.jobs.media import MEDIA_COLUMNS
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


def reject_missing(jobs: JobTable, storage_options: dict | None = None) -> tuple[JobTable, list[Rejection]]:
    """`jobs` without the rows whose image does not exist, and a `Rejection` (row, id, column, URL) for each."""
    table = jobs.table
    named = {column: table.column(column) for column in MEDIA_COLUMNS
             if column in table.column_names and table.column(column).null_count < table.num_rows}
    if not named:
        return jobs, []
    values = {column: array.to_pylist() for column, array in named.items()}
    missing = missing_media((url for urls in values.values() for url in urls if url is not None), storage_options)
    if not missing:
        return jobs, []
    problems = {}  # position in the table -> [(column, url)]
    for column, urls in values.items():
        for position, url in enumerate(urls):
            if url in missing:
                problems.setdefault(position, []).append((column, url))
    rejected = []
    for position, faults in sorted(problems.items()):
        job = JobTable(table.slice(position, 1))[0]
        rejected.extend(Rejection(row=job.row, job_id=job.id, column=column, reason=f"{url}: {missing[url]}",
                                  model=job.model, extra=job.extra) for column, url in faults)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(problems)] = False
    return JobTable(table.filter(pa.array(keep))), rejected
