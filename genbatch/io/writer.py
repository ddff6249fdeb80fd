"""A bounded background writer: uploads overlap the next job's denoising, without unbounded memory.

    writer = BackgroundWriter(max_pending=2)
    writer.submit(store.commit, job_id, media, "mp4", record)   # returns at once unless 2 are queued
    ...
    writer.failure    # the first error so far, without waiting (None while all went well)
    writer.flush()    # before a checkpoint and at exit: waits, then re-raises the first error
    writer.close()

One thread runs the tasks in submission order. A failed task does not stop the ones after it; its error is
kept on its Future and the first one since the last flush is re-raised by flush(). With
`skip_after_error=True` (the runner's writer: a failed upload stops the run) the tasks after a failure are not
run until the next flush, each Future holding that first error: against a store that is down, the checkpoints
a job still submits cost nothing instead of a --storage-timeout each.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class BackgroundWriter:
    """One writer thread fed by a queue of at most `max_pending` waiting tasks."""

    def __init__(self, max_pending: int = 2, name: str = "genbatch-writer", skip_after_error: bool = False):
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending} must be >= 1 (it bounds media held in memory)")
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self._first_error: BaseException | None = None
        self._closed = False
        self._skip_after_error = skip_after_error
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                future, fn, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                with self._lock:
                    skip = self._first_error if self._skip_after_error else None
                if skip is not None:
                    future.set_exception(skip)
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - kept for flush() and the Future
                    future.set_exception(exc)
                    with self._lock:
                        if self._first_error is None:
                            self._first_error = exc
            finally:
                self._queue.task_done()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Queue fn(*args, **kwargs); blocks only while `max_pending` tasks are already waiting."""
        if self._closed:
            raise RuntimeError("BackgroundWriter is closed: create a new one to submit more writes")
        if not self._thread.is_alive():
            raise RuntimeError("BackgroundWriter's thread has stopped: create a new one")
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    @property
    def failure(self) -> BaseException | None:
        """The first error since the last flush, without waiting (the job loop stops on a storage failure)."""
        with self._lock:
            return self._first_error

    @property
    def pending(self) -> int:
        """Tasks queued and not yet finished (approximate, for progress display)."""
        return self._queue.unfinished_tasks

    def flush(self) -> None:
        """Wait until every submitted task has finished; re-raise the first error since the last flush."""
        self._queue.join()
        with self._lock:
            error, self._first_error = self._first_error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Flush (re-raising the first error), then stop the thread. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self._queue.put(_STOP)
            self._thread.join()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the body's exception is the one to report; ours stay on Futures
            pass
