"""Whole-object reads and writes with the guarantees a resumable run needs, on any fsspec filesystem.

    objects = open_objects(fs, policy, url_of)
    objects.write_whole(path, data)        # readers see the old object or all of `data`, never a part
    objects.create_only(path, data)        # True if created, False if something was already there
    objects.read(path) -> bytes | None     # None when missing

Local disk: a temp file in the same folder, fsynced, then os.replace (whole) or os.link (create-only, fails if
the name exists); the temp file is removed in a `finally`, and `remove_stale_temps` clears those of killed
processes. Object stores: one PUT (s3fs is told a chunk size that keeps anything under 5 GiB off multipart),
markers with If-None-Match (`mode="create"`); a precondition failure (FileExistsError on AWS/moto,
OSError(22) on Ceph) means "already there". Every call goes through the retry policy (retry.py), each try
bounded by the time the policy has left (async filesystems take `timeout=`). Once an operation has failed past
the policy's bound the store counts as down, and later operations get one short try each (DOWN_TRY_S) until one
succeeds: the run is stopping, and its last writes (timings) must not each wait out the bound again.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable

from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.local import LocalFileSystem

from genbatch.io.retry import RetryPolicy, StorageError, call_with_retries

_SINGLE_PUT_LIMIT = 5 * 2**30  # the largest object S3 accepts in one PUT
_TEMP_MARK = ".tmp-"
DOWN_TRY_S = 1.0
"""The bound on each operation's one try while the store counts as down."""


def _is_precondition_failure(exc: BaseException) -> bool:
    seen = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            code = (response.get("Error") or {}).get("Code")
            if status == 412 or code == "PreconditionFailed":
                return True
        seen = seen.__cause__ or seen.__context__
    return "412" in str(exc) or "PreconditionFailed" in str(exc)


class FsspecObjects:
    """Whole-object operations on a remote (or memory) fsspec filesystem."""

    def __init__(self, fs, policy: RetryPolicy, url_of: Callable[[str], str]):
        self.fs = fs
        self.policy = policy
        self.url_of = url_of
        s3 = "s3" in _protocols(fs)
        self._put_kwargs = {"chunksize": _SINGLE_PUT_LIMIT} if s3 else {}
        self._get_kwargs = {"max_concurrency": 1} if s3 else {}  # one GET, no HEAD for the size first
        self._bound = "timeout" if isinstance(fs, AsyncFileSystem) else None  # fsspec cancels a call past it
        self.down: StorageError | None = None
        """The failure that found the store down (an operation failed past the policy's bound), until an
        operation succeeds again."""

    def _call(self, op: str, path: str, fn, *args, passthrough=(), **kwargs):
        down, policy = self.down, self.policy
        if down is not None:
            policy = dataclasses.replace(policy, attempts=1, timeout_s=min(policy.timeout_s or DOWN_TRY_S, DOWN_TRY_S))
        try:
            result = call_with_retries(
                policy, op, self.url_of(path), fn, *args, passthrough=passthrough, bound=self._bound, **kwargs
            )
        except StorageError as error:
            if down is None:
                self.down = error if error.transient else None
                raise
            raise StorageError(f"{error} (the store is down since: {down})", url=error.url,
                               transient=error.transient) from error
        self.down = None
        return result

    def write_whole(self, path: str, data: bytes) -> None:
        self._call("write", path, self.fs.pipe_file, path, bytes(data), **self._put_kwargs)

    def _create_once(self, path: str, data: bytes, **bound) -> None:
        try:
            self.fs.pipe_file(path, data, mode="create", **self._put_kwargs, **bound)
        except FileExistsError:
            raise
        except OSError as exc:
            # Ceph answers a failed If-None-Match with a 412 that s3fs turns into OSError(22): confirm.
            if _is_precondition_failure(exc) or (exc.errno == errno.EINVAL and self.fs.exists(path, **bound)):
                raise FileExistsError(errno.EEXIST, "already exists", path) from exc
            raise

    def create_only(self, path: str, data: bytes) -> bool:
        if not data:
            raise ValueError(f"create-only object {path!r} needs a non-empty body (empty bodies can overwrite)")
        try:
            self._call("create", path, self._create_once, path, bytes(data), passthrough=(FileExistsError,))
        except FileExistsError:
            return False
        return True

    def read(self, path: str) -> bytes | None:
        try:
            return self._call("read", path, self.fs.cat_file, path, passthrough=(FileNotFoundError,),
                              **self._get_kwargs)
        except FileNotFoundError:
            return None

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        """Read many small objects concurrently (s3fs batches them); missing ones are left out."""
        if not paths:
            return {}
        found = self._call("read", paths[0], self.fs.cat, list(paths), on_error="return", **self._get_kwargs)
        out: dict[str, bytes] = {}
        for path in paths:
            value = found.get(path, found.get(self.fs._strip_protocol(path)))
            if isinstance(value, FileNotFoundError):
                continue
            if isinstance(value, BaseException) or value is None:
                value = self.read(path)  # retried one by one under the policy
                if value is None:
                    continue
            out[path] = value
        return out

    def list_names(self, folder: str) -> list[str]:
        """Names of the objects directly under `folder` (one listing), temp files left out."""
        try:
            entries = self._call("list", folder, self.fs.ls, folder, detail=False,
                                 passthrough=(FileNotFoundError,))
        except FileNotFoundError:
            return []
        names = (entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)
        return sorted(name for name in names if name and not name.startswith("."))

    def remove(self, path: str) -> None:
        try:
            self._call("delete", path, self.fs.rm_file, path, passthrough=(FileNotFoundError,))
        except FileNotFoundError:
            pass

    def remove_stale_temps(self, root: str, older_than_s: float) -> int:
        """Object stores never show a partial PUT; nothing to clear here (see abort_stale_uploads)."""
        return 0


class LocalObjects(FsspecObjects):
    """The same operations on a local (or network-mounted POSIX) filesystem, atomic through rename/link."""

    def __init__(self, fs, policy: RetryPolicy, url_of: Callable[[str], str]):
        super().__init__(fs, policy, url_of)
        self._made: set[str] = set()
        self._tag = f"{socket.gethostname()}-{os.getpid()}"

    def _temp_beside(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        temp = os.path.join(folder, f".{os.path.basename(path)}{_TEMP_MARK}{self._tag}-{uuid.uuid4().hex[:8]}")
        with open(temp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    def _publish(self, path: str, data: bytes, link: bool) -> None:
        temp = None
        try:
            temp = self._temp_beside(path, data)
            if link:
                os.link(temp, path)  # atomic create-only: fails with FileExistsError if the name exists
            else:
                os.replace(temp, path)  # atomic: readers see the old file or the whole new one
                temp = None
        finally:
            if temp is not None:
                try:
                    os.unlink(temp)
                except FileNotFoundError:
                    pass

    def write_whole(self, path: str, data: bytes) -> None:
        self._call("write", path, self._publish, path, bytes(data), False)

    def create_only(self, path: str, data: bytes) -> bool:
        if not data:
            raise ValueError(f"create-only file {path!r} needs a non-empty body")
        try:
            self._call("create", path, self._publish, path, bytes(data), True, passthrough=(FileExistsError,))
        except FileExistsError:
            return False
        return True

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        out = {}
        for path in paths:
            data = self.read(path)
            if data is not None:
                out[path] = data
        return out

    def list_names(self, folder: str) -> list[str]:
        try:
            with os.scandir(folder) as entries:
                return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file())
        except FileNotFoundError:
            return []

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_stale_temps(self, root: str, older_than_s: float) -> int:
        """Remove temp files left by killed writers: this host's dead processes, or older than older_than_s."""
        host = socket.gethostname()
        removed = 0
        now = time.time()
        for folder, _dirs, names in os.walk(root):
            for name in names:
                if not name.startswith(".") or _TEMP_MARK not in name:
                    continue
                path = os.path.join(folder, name)
                owner = name.rsplit(_TEMP_MARK, 1)[1].rsplit("-", 2)
                try:
                    dead = len(owner) == 3 and owner[0] == host and not _pid_alive(int(owner[1]))
                    old = now - os.path.getmtime(path) > older_than_s
                    if dead or old:
                        os.unlink(path)
                        removed += 1
                except (FileNotFoundError, ValueError):
                    pass
        return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _protocols(fs) -> Iterable[str]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def open_objects(fs, policy: RetryPolicy, url_of: Callable[[str], str]) -> FsspecObjects:
    """The whole-object operations for `fs`: rename/link based on local disk, PUT based elsewhere."""
    cls = LocalObjects if isinstance(fs, LocalFileSystem) else FsspecObjects
    return cls(fs, policy, url_of)
