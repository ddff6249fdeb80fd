"""The JSON bodies of done and failure markers.

A done marker is written create-only after the job's output, so its existence is the job's completion. It
carries the runner's record (seed, sizes, per-stage seconds, the manifest's extra columns, ...), where the
output is and what it hashes to, and a token unique to the commit: a retried create-only PUT whose first try
landed (the answer was lost) finds its own token and knows the job was committed by this call, not before.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any

MARKER_VERSION = 1
_OUTPUT_FIELDS = ("output_uri", "output_bytes", "output_sha256", "committed_at", "attempt")


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy / torch scalars from manifest rows
    if callable(item):
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    raise TypeError(f"record value {value!r} of type {type(value).__name__} is not JSON-able: pass str/int/float")


def dumps(payload: dict[str, Any]) -> bytes:
    """Compact JSON for a marker; numpy scalars and dates are converted, other objects raise TypeError."""
    return json.dumps(payload, default=_json_default, separators=(",", ":"), sort_keys=True).encode()


def done_marker(
    record: dict[str, Any],
    *,
    output_uri: str,
    output_bytes: int,
    output_sha256: str,
    token: str,
    attempt: str,
) -> bytes:
    """The body of done/<id>.json."""
    return dumps({
        "version": MARKER_VERSION,
        "token": token,
        "attempt": attempt,
        "committed_at": time.time(),
        "output_uri": output_uri,
        "output_bytes": output_bytes,
        "output_sha256": output_sha256,
        "record": dict(record),
    })


def failure_marker(record: dict[str, Any], *, attempt: str, failed_in: list[str]) -> bytes:
    """The body of failed/<id>.json; `failed_in`: every run attempt the job has failed in, this one last."""
    return dumps({"version": MARKER_VERSION, "attempt": attempt, "failed_at": time.time(), "failed_in": failed_in,
                  "record": dict(record)})


def failed_in(payload: dict[str, Any]) -> list[str]:
    """The run attempts a failure marker says the job failed in (markers before the list: their one attempt)."""
    attempts = payload.get("failed_in")
    if isinstance(attempts, list):
        return [str(a) for a in attempts]
    return [str(payload["attempt"])] if payload.get("attempt") else []


def parse(data: bytes, where: str) -> dict[str, Any]:
    """The decoded marker; a corrupt one raises ValueError naming it (delete it to redo the job)."""
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"marker {where} is not valid JSON ({exc}): delete it to run that job again") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("record"), dict):
        raise ValueError(f"marker {where} has no record: delete it to run that job again")
    return payload


def flat_done(payload: dict[str, Any]) -> dict[str, Any]:
    """A done marker as one flat record: the runner's record plus where the output is."""
    return {**payload["record"], **{key: payload.get(key) for key in _OUTPUT_FIELDS}}


def flat_failure(payload: dict[str, Any]) -> dict[str, Any]:
    """A failure marker as one flat record."""
    return {**payload["record"], "failed_at": payload.get("failed_at"), "attempt": payload.get("attempt"),
            "failed_runs": len(failed_in(payload))}
