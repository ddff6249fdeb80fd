"""Retries for object-store calls: transient errors back off and retry, permanent ones fail at once.

    policy = RetryPolicy(timeout_s=120)              # `gen run --storage-timeout 120`
    data = call_with_retries(policy, "read", url, fs.cat_file, path, bound="timeout")

Transient: 5xx, throttling (SlowDown), request timeouts, reset/closed/refused connections.
Permanent: everything else (403, 404 on a write, a bad bucket name, a bad request); they raise a
StorageError naming the URL and the fix. Exceptions listed in `passthrough` (FileNotFoundError on a read,
FileExistsError on a create-only write) reach the caller unchanged: they are answers, not failures.

One operation, all its tries and waits included, takes at most `timeout_s`: the loop stops retrying at that
deadline, and with `bound="timeout"` each try is handed the time left (fsspec's async filesystems cancel a
call past its `timeout=`), so a hung server cannot hold a try longer than the whole. The inner layers (s3fs's
and botocore's retries, botocore's socket timeouts) are set in options.py to stay inside the same bound.
"""

from __future__ import annotations

import errno
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeoutException",
    "ServiceUnavailable", "InternalError", "OperationAborted", "RequestLimitExceeded",
    "TooManyRequestsException", "503", "500", "502", "504",
}
_TRANSIENT_ERRNOS = {
    errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED,
    errno.EPIPE, errno.EREMOTEIO, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET,
}
_TRANSIENT_NAMES = {  # exception classes from botocore, aiohttp, urllib3 and http.client, by name
    "HTTPClientError", "ConnectionClosedError", "EndpointConnectionError", "ReadTimeoutError",
    "ConnectTimeoutError", "ProxyConnectionError", "ResponseParserError", "IncompleteRead",
    "IncompleteReadError", "ServerDisconnectedError", "ClientOSError", "ClientConnectionError",
    "ClientConnectorError", "ClientPayloadError", "ServerTimeoutError", "RemoteDisconnected",
    "FSTimeoutError", "ProtocolError",
}


@dataclass(kw_only=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a transient storage error (exponential backoff, full jitter)."""

    timeout_s: float | None = 120.0
    """The most seconds one operation may take, every try and wait included (`--storage-timeout`); past it a
    transient failure raises StorageError(transient=True). None: no time bound (then `attempts` is needed)."""
    attempts: int | None = None
    """Tries in all, the first included; 1 turns retrying off. None: as many as fit in `timeout_s`."""
    base_delay_s: float = 0.1
    """Upper bound of the first wait; each later bound doubles."""
    max_delay_s: float = 5.0
    """Cap on any single wait."""

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts} must be >= 1 (1 means no retries)")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"RetryPolicy.timeout_s={self.timeout_s} must be > 0 seconds (--storage-timeout)")
        if self.timeout_s is None and self.attempts is None:
            raise ValueError("RetryPolicy needs a bound: give timeout_s (seconds) or attempts (tries)")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError(
                f"RetryPolicy delays base={self.base_delay_s}, max={self.max_delay_s}: need 0 <= base <= max"
            )

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0-based): uniform in [0, min(max, base * 2**retry)]."""
        bound = min(self.max_delay_s, self.base_delay_s * (2**retry))
        return (rng or random).uniform(0.0, bound)


class StorageError(OSError):
    """A storage call that failed for good: permanent (exit 2), or transient past the retry budget (exit 75)."""

    def __init__(self, message: str, *, url: str, transient: bool):
        super().__init__(message)
        self.url = url
        self.transient = transient

    def __reduce__(self):  # rank 0 shares its start-up failure with every rank (broadcast_object_list pickles)
        return _storage_error, (str(self), self.url, self.transient)


def _storage_error(message: str, url: str, transient: bool) -> StorageError:
    return StorageError(message, url=url, transient=transient)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _client_error_code(exc: BaseException) -> tuple[str, int | None] | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code, status


def is_transient(exc: BaseException) -> bool:
    """True when retrying `exc` may succeed: throttling, 5xx, timeouts, broken connections."""
    for err in _chain(exc):
        if isinstance(err, (FileNotFoundError, PermissionError, FileExistsError)):
            return False
        coded = _client_error_code(err)
        if coded is not None:
            code, status = coded
            return code in _TRANSIENT_CODES or (status is not None and status >= 500) or status == 429
        if isinstance(err, (ConnectionError, TimeoutError, socket.timeout)):
            return True
        if type(err).__name__ in _TRANSIENT_NAMES:
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def _fix_for(exc: BaseException, op: str) -> str:
    if any(isinstance(e, PermissionError) for e in _chain(exc)):
        return ("check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or --storage-option "
                "key=... secret=...) and that they may read and write this prefix")
    if any(isinstance(e, FileNotFoundError) for e in _chain(exc)):
        return "check that the bucket exists (create it first) and that --out names it correctly"
    if is_transient(exc):
        return ("the store kept failing: check the endpoint (AWS_ENDPOINT_URL or --storage-option "
                "endpoint_url=...) and its health, then rerun the same command (the run's state is kept); "
                "--storage-timeout sets how long an operation may keep failing")
    if "bucket" in " ".join(f"{type(e).__name__} {e}" for e in _chain(exc)).lower():
        return "check the bucket name in --out (3-63 lowercase letters, digits, dots, hyphens)"
    return f"check the URL, the endpoint and the permissions for {op}"


def call_with_retries(
    policy: RetryPolicy,
    op: str,
    url: str,
    fn: Callable[..., T],
    *args: Any,
    passthrough: tuple[type[BaseException], ...] = (),
    bound: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    **kwargs: Any,
) -> T:
    """Call fn(*args, **kwargs); retry transient errors under `policy`; raise StorageError otherwise.

    `bound`: the name of fn's keyword that caps one try in seconds (fsspec async filesystems: "timeout"); each
    try gets the time left before the policy's deadline."""
    started = clock()
    deadline = None if policy.timeout_s is None else started + policy.timeout_s
    attempt = 0
    while True:
        if bound is not None and deadline is not None:
            kwargs[bound] = max(deadline - clock(), 0.001)
        try:
            return fn(*args, **kwargs)
        except passthrough:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised as StorageError
            attempt += 1
            transient = is_transient(exc)
            wait = policy.delay(attempt - 1)
            tries_left = policy.attempts is None or attempt < policy.attempts
            left = None if deadline is None else deadline - clock()
            if transient and tries_left and bound is not None and left is not None and wait >= left:
                wait = left / 2 if left >= 2 * _LAST_TRY_S else None  # a bounded try fits: use the time left
            elif not (left is None or wait < left):
                wait = None  # the drawn wait would end past the deadline
            if transient and tries_left and wait is not None:
                sleep(wait)
                continue
            raise StorageError(
                f"{op} {url} failed{_spent(attempt, clock() - started, policy) if transient else ''}: "
                f"{type(exc).__name__}: {str(exc) or 'no answer in time'}. Fix: {_fix_for(exc, op)}",
                url=url,
                transient=transient,
            ) from exc


_LAST_TRY_S = 0.05
"""The least time a bounded try is given; less left before the deadline, and the operation fails."""


def _spent(tries: int, seconds: float, policy: RetryPolicy) -> str:
    counted = f"{tries} {'try' if tries == 1 else 'tries'}"
    if policy.attempts is not None and tries >= policy.attempts:
        return f" after {counted}"
    return f" after {counted} in {seconds:.1f} s (--storage-timeout {policy.timeout_s:g} s)"
