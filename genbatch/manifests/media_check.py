"""May the rows' input images be read, and do they exist? Judged before any job runs, never one read per row.

First the run's media policy (`genbatch.io.media_policy`): a URL outside the allowed prefixes (after `..` and
symlinks are resolved), or an http(s) URL naming a refused address, is refused without being touched. Then
`missing_media(urls)` lists each distinct parent folder (or bucket prefix) of the other URLs once, through
fsspec with the manifest's storage options, and returns the URLs not found, or larger than `--media-max-mib`,
with the reason. A folder that cannot be listed (permissions, an endpoint down) and an http(s) URL stay
unjudged: the rank that reads such an image later judges it the same way for its job. `reject_missing` turns a
manifest's valid rows with such an image into rejections. Whether a file that exists is a decodable image is
known only by reading it (`genbatch.io.media_input`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.io.media_policy import HTTP_SCHEMES, MediaPolicy, literal_refusal
from genbatch.jobs.media import MEDIA_COLUMNS
from genbatch.jobs.spec import JobSpec
from genbatch.jobs.table import JobTable
from genbatch.manifests.validate import Rejection

MISSING = "no such file; check the path (a relative one is taken from the manifest's directory)"


def _split(url: str) -> tuple[str, str]:
    parent, _, name = url.rstrip("/").rpartition("/")
    return parent or "/", name


def _is_http(url: str) -> bool:
    return url.split("://", 1)[0].lower() in HTTP_SCHEMES if "://" in url else False


def refused_media(urls: Iterable[str], policy: MediaPolicy) -> dict[str, str]:
    """URL -> why the policy refuses it, without touching it: outside the allowed prefixes, or an http(s) URL
    whose host is a refused address (its lookup and its redirects are judged when it is read)."""
    from urllib.parse import urlsplit

    refused = {}
    for url in set(urls):
        reason = policy.outside(url)
        if reason is None and _is_http(url):
            reason = literal_refusal(urlsplit(url).hostname or "", policy.refuse)
        if reason is not None:
            refused[url] = reason
    return refused


def missing_media(urls: Iterable[str], storage_options: dict | None = None,
                  policy: MediaPolicy | None = None) -> dict[str, str]:
    """URL -> why it cannot be read, for each of `urls` that its folder's listing does not hold, or holds at
    more than the policy's `max_bytes`; http(s) URLs are left to the reading rank."""
    import fsspec

    folders: dict[str, list[str]] = {}
    for url in set(urls):
        if not _is_http(url):
            folders.setdefault(_split(url)[0], []).append(url)
    missing = {}
    for folder, members in sorted(folders.items()):
        try:
            fs, root = fsspec.core.url_to_fs(folder, **(storage_options or {}))
            sizes = {entry["name"].rstrip("/").rpartition("/")[2]: entry.get("size")
                     for entry in fs.ls(root, detail=True)}
        except FileNotFoundError:
            sizes = {}
        except Exception:  # noqa: BLE001 - unlisted: the reading rank judges these URLs
            continue
        for url in members:
            name = _split(url)[1]
            if name not in sizes:
                missing[url] = MISSING
            elif policy is not None and (reason := policy.too_large(sizes[name])) is not None:
                missing[url] = reason
    return missing


def row_id(job: JobSpec) -> str:
    """The id of the manifest row a job comes from (a rejection names the row, not one of its outputs)."""
    return job.id if job.source_id is None else job.source_id


def media_rejections(jobs: Iterable[JobSpec], storage_options: dict | None = None,
                     policy: MediaPolicy | None = None) -> dict[int, list[Rejection]]:
    """Manifest row -> its rejections (column, URL), for each of `jobs` that names an image or an adapter the
    policy refuses or that does not exist (an adapter's size is its header's to bound, when it is read)."""
    jobs = list(jobs)
    urls = {getattr(job, column) for job in jobs for column in MEDIA_COLUMNS if getattr(job, column) is not None}
    adapters = {ref.uri for job in jobs for ref in job.lora if not ref.is_hub_id}
    missing = refused_media(urls | adapters, policy) if policy is not None else {}
    missing.update(missing_media(urls - set(missing), storage_options, policy))
    missing.update(missing_media(adapters - set(missing), storage_options))
    found = {}
    for job in jobs:
        faults = [Rejection(row=job.row, job_id=row_id(job), column=column, reason=missing[getattr(job, column)],
                            subject=getattr(job, column), model=job.model, extra=job.extra)
                  for column in MEDIA_COLUMNS if getattr(job, column) in missing]
        faults += [Rejection(row=job.row, job_id=row_id(job), column="lora", reason=missing[ref.uri], subject=ref.uri,
                             model=job.model, extra=job.extra) for ref in job.lora if ref.uri in missing]
        if faults:
            found[job.row] = faults
    return found


def reject_missing(jobs: JobTable, storage_options: dict | None = None,
                   policy: MediaPolicy | None = None) -> tuple[JobTable, list[Rejection]]:
    """`jobs` without the rows whose image is refused or does not exist, and their rejections
    (`media_rejections`)."""
    table = jobs.table
    names = np.zeros(table.num_rows, dtype=bool)
    for column in (*MEDIA_COLUMNS, "lora"):
        if column in table.column_names:
            names |= pc.is_valid(table.column(column)).to_numpy(zero_copy_only=False)
    if not names.any():
        return jobs, []
    named = np.flatnonzero(names)  # one job per row is enough: a row's outputs name the same media
    _, firsts = np.unique(table.column("row").take(pa.array(named)).to_numpy(), return_index=True)
    found = media_rejections(JobTable(table.take(pa.array(named[firsts]))), storage_options, policy)
    if not found:
        return jobs, []
    kept = table.filter(pc.invert(pc.is_in(table.column("row"), value_set=pa.array(list(found), pa.int64()))))
    return JobTable(kept), [rejection for row in sorted(found) for rejection in found[row]]
