"""RunStore: everything a run writes and reads, on a local path or any fsspec URL (s3://, gs://, memory://).

    store = RunStore("s3://bucket/run", storage_options, rank=rank)
    if job_id not in store.done_ids():                         # ONE listing of done/
        result = store.commit(job_id, mp4_bytes, "mp4", record)  # media whole, THEN a create-only marker

The done marker is the only proof of completion: it is created (never overwritten) after the output is
wholly written, so a crash at any moment leaves either a finished job or one that reruns from scratch (or
from its checkpoint). See layout.py for the folder layout, objects.py for how each write stays whole.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from genbatch.io import markers, tables
from genbatch.io.layout import RunLayout, encode_id
from genbatch.io.objects import open_objects
from genbatch.io.options import open_filesystem
from genbatch.io.retry import RetryPolicy
from genbatch.io.uploads import abort_open_uploads


@dataclass(kw_only=True, slots=True)
class CommitResult:
    """What commit() did for one job."""

    job_id: str
    """The job committed."""
    output_uri: str
    """Where the job's output is (the earlier one when already_done)."""
    already_done: bool
    """True when a done marker existed before this call: nothing was written."""
    bytes_written: int
    """Media bytes uploaded by this call (0 when already_done)."""
    seconds: float
    """Wall time of the whole commit."""


def new_attempt_id() -> str:
    """A sortable, unique id for one start of a run: UTC time plus random hex."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


class RunStore:
    """The outputs, markers, checkpoints, timings and results of one run under one URL."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        rank: int = 0,
        attempt: str | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.retry = retry or RetryPolicy()
        self.fs, root, self.url = open_filesystem(url, storage_options, timeout_s=self.retry.timeout_s)
        self.layout = RunLayout(root)
        self.rank = rank
        self.attempt = attempt or new_attempt_id()
        self.objects = open_objects(self.fs, self.retry, self._url_of)
        self._timings: list[dict[str, Any]] = []
        self._timing_parts = 0
        self._instance = uuid.uuid4().hex[:6]  # two stores of one rank and attempt still never collide
        self._lock = threading.Lock()

    def _url_of(self, path: str) -> str:
        return self.url + path[len(self.layout.root):] if path.startswith(self.layout.root) else path

    def __repr__(self) -> str:
        return f"RunStore({self.url!r}, rank={self.rank}, attempt={self.attempt!r})"

    # ---- outputs and done markers -------------------------------------------------------------------
    def output_uri(self, job_id: str, ext: str) -> str:
        """The URI the job's output gets: OUT/outputs/<id>.<ext>."""
        return self._url_of(self.layout.output(job_id, ext))

    def done_ids(self) -> set[str]:
        """Ids of every job with a done marker: one listing, not one request per job."""
        return RunLayout.ids_from_names(self.objects.list_names(self.layout.join("done")))

    def _read_marker(self, path: str) -> dict[str, Any] | None:
        data = self.objects.read(path)
        return None if data is None else markers.parse(data, self._url_of(path))

    def read_done(self, job_id: str) -> dict[str, Any] | None:
        """The record of a job's done marker (plus output_uri, output_bytes, output_sha256, ...), or None."""
        payload = self._read_marker(self.layout.done(job_id))
        return None if payload is None else markers.flat_done(payload)

    def commit(self, job_id: str, media: bytes, ext: str, record: dict[str, Any]) -> CommitResult:
        """Write the job's media whole, then its create-only done marker holding `record`.

        A job already done is left untouched (already_done=True). If this call crashes between the two
        writes, the job simply is not done; a rerun overwrites the output and commits again.
        """
        started = time.perf_counter()
        marker_path, output_path = self.layout.done(job_id), self.layout.output(job_id, ext)
        output_uri = self._url_of(output_path)
        media = bytes(media)
        token = uuid.uuid4().hex
        body = markers.done_marker(  # built first: a record that is not JSON-able fails before any write
            record, output_uri=output_uri, output_bytes=len(media),
            output_sha256=hashlib.sha256(media).hexdigest(), token=token, attempt=self.attempt,
        )
        existing = self._read_marker(marker_path)
        if existing is not None:
            return self._result(job_id, existing.get("output_uri", output_uri), True, 0, started)
        self.objects.write_whole(output_path, media)
        if self.objects.create_only(marker_path, body):
            return self._result(job_id, output_uri, False, len(media), started)
        # The marker exists: either our own first try landed and only its answer was lost, or another
        # writer finished the job between our check and now (then our output bytes equal theirs).
        winner = self._read_marker(marker_path)
        ours = winner is not None and winner.get("token") == token
        uri = output_uri if winner is None else winner.get("output_uri", output_uri)
        return self._result(job_id, uri, not ours, len(media), started)

    @staticmethod
    def _result(job_id: str, uri: str, already: bool, size: int, started: float) -> CommitResult:
        return CommitResult(job_id=job_id, output_uri=uri, already_done=already, bytes_written=size,
                            seconds=time.perf_counter() - started)

    # ---- failures and rejected rows -----------------------------------------------------------------
    def record_failure(self, job_id: str, record: dict[str, Any]) -> None:
        """Write failed/<id>.json with this failure, counting the run attempts the job has failed in so far.

        Every rank of a group may record the same failure: each writes the earlier attempts plus this one,
        so the count goes up by one per run attempt, however many ranks write it."""
        path = self.layout.failed(job_id)
        try:
            earlier = self._read_marker(path)
        except ValueError:  # a corrupt earlier record: this failure replaces it
            earlier = None
        attempts = list(dict.fromkeys([*(markers.failed_in(earlier) if earlier else []), self.attempt]))
        self.objects.write_whole(path, markers.failure_marker(record, attempt=self.attempt, failed_in=attempts))

    def failed_runs(self) -> dict[str, int]:
        """Per failed job id, in how many run attempts it has failed."""
        return {job_id: int(record["failed_runs"]) for job_id, record in self._read_markers("failed").items()}

    def failures(self) -> dict[str, dict[str, Any]]:
        """Per job id with a failure record and no done marker, that record (its fields, `error`, `column` when
        one is to blame, `failed_runs`: the run attempts it has failed in)."""
        done = self.done_ids()
        return {job_id: record for job_id, record in self._read_markers("failed").items() if job_id not in done}

    def failed_ids(self) -> set[str]:
        """Ids with a failure record (some may be done since: done wins)."""
        return RunLayout.ids_from_names(self.objects.list_names(self.layout.join("failed")))

    def write_rejected(self, records: list[dict[str, Any]]) -> None:
        """rejected/rejected.parquet: one row per problem: id, row, column, reason (+ any other keys)."""
        table = tables.records_to_table(records, ("id", "row", "column", "reason"))
        self.objects.write_whole(self.layout.join("rejected", "rejected.parquet"), tables.to_parquet_bytes(table))

    def read_rejected(self) -> list[dict[str, Any]]:
        data = self.objects.read(self.layout.join("rejected", "rejected.parquet"))
        return [] if data is None else tables.from_parquet_bytes(data).to_pylist()

    # ---- timings ------------------------------------------------------------------------------------
    def append_timings(self, rows: list[dict[str, Any]]) -> None:
        """Buffer timing rows (run_id, job_id, rank, stage, step, start, seconds, optional numbers)."""
        tables.timings_table(rows)  # validate now, where the caller can see which row is wrong
        with self._lock:
            self._timings.extend(rows)

    def flush_timings(self) -> str | None:
        """Write the buffered rows as one part file (named by attempt, rank and sequence); its URI or None."""
        with self._lock:
            rows, self._timings = self._timings, []
            if not rows:
                return None
            seq = self._timing_parts
            self._timing_parts += 1
        name = f"{self.attempt}-r{self.rank:05d}-{self._instance}-{seq:06d}.parquet"
        path = self.layout.join("timings", name)
        try:
            self.objects.write_whole(path, tables.to_parquet_bytes(tables.timings_table(rows)))
        except BaseException:
            with self._lock:  # keep the rows for the next flush
                self._timings[:0] = rows
            raise
        return self._url_of(path)

    def read_timings(self) -> pa.Table:
        """Every timing part of the run (all ranks, all attempts) as one table, each stage under today's name
        (`stage_names`: a part written before a rename reads as one written after)."""
        from genbatch.io.stage_names import with_current_stages

        folder = self.layout.join("timings")
        paths = [f"{folder}/{name}" for name in self.objects.list_names(folder) if name.endswith(".parquet")]
        found = self.objects.read_many(paths)
        return with_current_stages(tables.concat([tables.from_parquet_bytes(found[p]) for p in paths if p in found]))

    # ---- run metadata and results -------------------------------------------------------------------
    def write_run_info(self, info: dict[str, Any]) -> None:
        """run.json (the latest attempt's) and attempts/<attempt>.json."""
        body = json.dumps({"attempt": self.attempt, **info}, indent=2, default=markers._json_default).encode()
        self.objects.write_whole(self.layout.join("attempts", f"{self.attempt}.json"), body)
        self.objects.write_whole(self.layout.join("run.json"), body)

    def read_run_info(self) -> dict[str, Any] | None:
        data = self.objects.read(self.layout.join("run.json"))
        return None if data is None else json.loads(data)

    def _read_markers(self, folder: str, known: dict[str, dict[str, Any]] | None = None,
                      listed: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Every marker of `folder` by job id; those in `known` (by id) are taken from there, not read;
        `listed`: the ids a listing of `folder` just gave (then it is not listed again)."""
        known = known or {}
        if listed is None:
            names = [n for n in self.objects.list_names(self.layout.join(folder)) if n.endswith(".json")]
            ids = {name: next(iter(RunLayout.ids_from_names([name]))) for name in names}
        else:
            ids = {f"{encode_id(job_id)}.json": job_id for job_id in listed}
            names = list(ids)
        paths = {self.layout.join(folder, name): name for name in names if ids[name] not in known}
        found = self.objects.read_many(list(paths))
        flat = markers.flat_done if folder == "done" else markers.flat_failure
        records = {ids[name]: known[ids[name]] for name in names if ids[name] in known}
        records.update({ids[paths[p]]: flat(markers.parse(data, self._url_of(p))) for p, data in found.items()})
        return records

    def _results_done(self) -> dict[str, dict[str, Any]]:
        """The rows the current results table lists as done (a done marker never changes: they stay valid)."""
        try:
            table = self.read_results()
        except (OSError, ValueError, pa.ArrowException):  # unreadable: every marker is read again
            return {}
        if table is None or not {"id", "status"} <= set(table.column_names):
            return {}
        import pyarrow.compute as pc

        rows = table.filter(pc.equal(table.column("status"), "done")).to_pylist()
        return {row["id"]: {key: value for key, value in row.items() if key != "status"} for row in rows}

    def write_results(self, extra_columns: Iterable[str] = (), done_ids: Iterable[str] | None = None) -> str:
        """Consolidate results/results.parquet (one row per job); return its URI. `done_ids`: what `done_ids()`
        just gave, when nothing can have been committed since (then done/ is not listed again).

        Jobs the previous table already lists as done keep their rows and only newer done markers are
        read, so a rerun of a finished run costs one listing and one table, not one read per job."""
        table = self.collect_results(extra_columns, done_ids)
        path = self.layout.join("results", "results.parquet")
        self.objects.write_whole(path, tables.to_parquet_bytes(table))
        return self._url_of(path)

    def collect_results(self, extra_columns: Iterable[str] = (), done_ids: Iterable[str] | None = None) -> pa.Table:
        """The results table as `write_results` would write it now (one row per job, from the markers and the
        rejected rows), without writing it: what a reader of a run still running sees (`gen report`)."""
        return tables.build_results(
            self._read_markers("done", known=self._results_done(), listed=done_ids), self._read_markers("failed"),
            self.read_rejected(), list(extra_columns),
        )

    def read_results(self) -> pa.Table | None:
        data = self.objects.read(self.layout.join("results", "results.parquet"))
        return None if data is None else tables.from_parquet_bytes(data)

    def status_counts(self, job_ids: Iterable[str]) -> dict[str, int]:
        """done / failed / rejected / pending over the manifest's ids (rejected counts rejected rows)."""
        wanted = set(job_ids)
        done = self.done_ids() & wanted
        failed = (self.failed_ids() & wanted) - done
        rejected_rows = self.read_rejected()
        rejected_ids = {r.get("id") for r in rejected_rows}
        # rejected manifest rows (a duplicate id's row is one of its own), as the results table lists them
        rejected = len({("row", r.get("row")) if r.get("row") is not None else r.get("id") for r in rejected_rows})
        pending = wanted - done - failed - rejected_ids
        return {"done": len(done), "failed": len(failed), "rejected": rejected, "pending": len(pending)}

    # ---- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, job_id: str, payload: bytes) -> None:
        """Replace the job's checkpoint whole (a reader sees the previous one or this one, never a part)."""
        self.objects.write_whole(self.layout.checkpoint(job_id), payload)

    def load_checkpoint(self, job_id: str) -> bytes | None:
        return self.objects.read(self.layout.checkpoint(job_id))

    def delete_checkpoint(self, job_id: str) -> None:
        self.objects.remove(self.layout.checkpoint(job_id))

    # ---- housekeeping at run start ------------------------------------------------------------------
    def abort_stale_uploads(self, older_than_s: float = 0.0) -> int:
        """S3 only: abort open multipart uploads under the run prefix; how many were aborted."""
        if "s3" not in ((self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol):
            return 0
        return abort_open_uploads(self.fs, self.layout.root, self.retry, self.url, older_than_s)

    def remove_stale_temps(self, older_than_s: float = 3600.0) -> int:
        """Local only: delete temp files of killed writers (dead pids on this host, or older than this)."""
        return self.objects.remove_stale_temps(self.layout.root, older_than_s)

    def remove_done_checkpoints(self) -> int:
        """Delete checkpoints of jobs already done (a kill between commit and delete leaves one)."""
        names = self.objects.list_names(self.layout.join("checkpoints"))
        if not names:
            return 0  # nothing to compare: done/ (perhaps 100k markers) is not listed
        done = self.done_ids()
        stale = [job_id for job_id in RunLayout.ids_from_names(names, ".ckpt") if job_id in done]
        for job_id in stale:
            self.delete_checkpoint(job_id)
        return len(stale)

    def recover(self, older_than_s: float = 3600.0) -> dict[str, int]:
        """Clear what killed runs leave behind; call once at run start on one rank, before any writes.

        Aborts open multipart uploads under the run (S3), removes temp files of dead writers (local) and
        checkpoints of jobs that are done. `older_than_s` spares temp files of live writers on other hosts.
        """
        return {
            "aborted_uploads": self.abort_stale_uploads(),
            "removed_temps": self.remove_stale_temps(older_than_s),
            "removed_checkpoints": self.remove_done_checkpoints(),
        }
