"""Where each thing of a run lives under its root, and how job ids become object names.

    OUT/outputs/<id>.<ext>        media, written whole
    OUT/done/<id>.json            create-only done marker (the job's record, written after its output)
    OUT/failed/<id>.json          latest failure of a job (overwritten: reruns retry failed jobs)
    OUT/checkpoints/<id>.ckpt     step checkpoint of a running job, replaced whole, deleted when done
    OUT/rejected/rejected.parquet manifest rows rejected by validation
    OUT/timings/<attempt>-r<rank>-<store>-<seq>.parquet   per-event timings, one part file per flush
    OUT/results/results.parquet   one row per job, consolidated from the above
    OUT/run.json, OUT/attempts/<attempt>.json    run metadata (latest, and one per attempt)

Ids are kept as they are when made of letters, digits and `-_.~`; anything else (a `/`, a space, a leading
dot that would hide the file) is percent-encoded, so every id maps to exactly one flat name and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

_MAX_NAME = 200  # leaves room for an extension and temp suffix under the common 255-byte name limit


def encode_id(job_id: str) -> str:
    """The flat object name of a job id (reversible with decode_id)."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job id {job_id!r} must be a non-empty string: fix the manifest's id column")
    name = quote(job_id, safe="-_.~")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name.encode()) > _MAX_NAME:
        raise ValueError(f"job id {job_id[:40]!r}... is too long for an object name: keep ids under 200 bytes")
    return name


def decode_id(name: str) -> str:
    """The job id of a flat object name made by encode_id."""
    return unquote(name)


@dataclass(frozen=True, slots=True)
class RunLayout:
    """Paths (inside the run's filesystem) of everything a run stores."""

    root: str
    """The run's root path inside its filesystem, without a trailing slash."""

    def join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def output(self, job_id: str, ext: str) -> str:
        ext = ext.lstrip(".")
        if not ext or not ext.isalnum():
            raise ValueError(f"output extension {ext!r} must be letters/digits such as 'png' or 'mp4'")
        return self.join("outputs", f"{encode_id(job_id)}.{ext}")

    def done(self, job_id: str) -> str:
        return self.join("done", f"{encode_id(job_id)}.json")

    def failed(self, job_id: str) -> str:
        return self.join("failed", f"{encode_id(job_id)}.json")

    def checkpoint(self, job_id: str) -> str:
        return self.join("checkpoints", f"{encode_id(job_id)}.ckpt")

    @staticmethod
    def ids_from_names(names: list[str], suffix: str = ".json") -> set[str]:
        """Job ids from the object names of a marker folder."""
        return {decode_id(name[: -len(suffix)]) for name in names if name.endswith(suffix)}
