"""Open multipart uploads under a run prefix: a writer killed mid-multipart leaves one behind (billed, and
invisible to listings). The runner aborts them at start-up, before any rank writes.

Media and markers are single PUTs below 5 GiB (objects.py), so only huge files ever go multipart.
"""

from __future__ import annotations

import datetime as _dt
import time

from genbatch.io.retry import RetryPolicy, call_with_retries


def _initiated_s(upload: dict) -> float:
    initiated = upload.get("Initiated")
    if isinstance(initiated, _dt.datetime):
        return initiated.timestamp()
    return 0.0


def list_open_uploads(fs, root: str, policy: RetryPolicy, url: str) -> list[dict]:
    """Open multipart uploads whose key starts with `root/` (paginated)."""
    bucket, _, prefix = root.partition("/")
    prefix = f"{prefix.rstrip('/')}/" if prefix else ""
    uploads: list[dict] = []
    markers: dict[str, str] = {}
    while True:
        page = call_with_retries(
            policy, "list multipart uploads", url, fs.call_s3,
            "list_multipart_uploads", Bucket=bucket, Prefix=prefix, bound="timeout", **markers,
        )
        uploads.extend(page.get("Uploads") or [])
        if not page.get("IsTruncated"):
            return uploads
        markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def abort_open_uploads(fs, root: str, policy: RetryPolicy, url: str, older_than_s: float = 0.0) -> int:
    """Abort open multipart uploads under `root` started more than `older_than_s` ago; return how many."""
    bucket = root.partition("/")[0]
    cutoff = time.time() - older_than_s
    aborted = 0
    for upload in list_open_uploads(fs, root, policy, url):
        if older_than_s > 0 and _initiated_s(upload) > cutoff:
            continue
        try:
            call_with_retries(
                policy, "abort multipart upload", url, fs.call_s3, "abort_multipart_upload",
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"], passthrough=(FileNotFoundError,),
                bound="timeout",
            )
        except FileNotFoundError:  # finished or aborted meanwhile
            continue
        aborted += 1
    return aborted
