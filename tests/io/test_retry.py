from __future__ import annotations

import random

import aiohttp
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from s3fs.errors import translate_boto_error

from genbatch.io import RetryPolicy, StorageError, is_transient
from genbatch.io.retry import call_with_retries


def _s3_error(code: str, status: int, condition: str | None = None) -> BaseException:
    error = {"Code": code, "Message": f"{code} happened"}
    if condition:
        error["Condition"] = condition
    client_error = ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    return translate_boto_error(client_error)  # what s3fs raises


@pytest.mark.parametrize("exc", [
    _s3_error("SlowDown", 503), _s3_error("ServiceUnavailable", 503), _s3_error("InternalError", 500),
    _s3_error("RequestTimeout", 400), _s3_error("BadGateway", 502), _s3_error("TooManyRequests", 429),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), ConnectionClosedError(endpoint_url="http://x"),
    ReadTimeoutError(endpoint_url="http://x"), aiohttp.ServerDisconnectedError(), ConnectionResetError(),
    TimeoutError(),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
def test_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    _s3_error("AccessDenied", 403), _s3_error("NoSuchBucket", 404), _s3_error("InvalidBucketName", 400),
    _s3_error("PreconditionFailed", 412), _s3_error("PreconditionFailed", 412, "If-None-Match"),
    ValueError("bad"), FileNotFoundError("x"),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
def test_permanent(exc):
    assert not is_transient(exc)


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(attempts=8, base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(0)
    for retry in range(8):
        delays = [policy.delay(retry, rng) for _ in range(200)]
        bound = min(1.0, 0.1 * 2**retry)
        assert 0 <= min(delays) and max(delays) <= bound and max(delays) > 0.8 * bound  # full jitter
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="base"):
        RetryPolicy(base_delay_s=2.0, max_delay_s=1.0)


class _Flaky:
    def __init__(self, errors):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, value):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return value


def test_transient_errors_are_retried_until_success():
    sleeps = []
    flaky = _Flaky([_s3_error("SlowDown", 503), ConnectionResetError()])
    result = call_with_retries(RetryPolicy(attempts=3), "write", "s3://b/k", flaky, "ok", sleep=sleeps.append)
    assert result == "ok" and flaky.calls == 3 and len(sleeps) == 2


def test_retries_run_out():
    flaky = _Flaky([_s3_error("SlowDown", 503)] * 5)
    with pytest.raises(StorageError, match=r"write s3://b/k failed after 3 tries.*endpoint") as caught:
        call_with_retries(RetryPolicy(attempts=3), "write", "s3://b/k", flaky, 1, sleep=lambda s: None)
    assert caught.value.transient and caught.value.url == "s3://b/k" and flaky.calls == 3


@pytest.mark.parametrize("error, fix", [
    (_s3_error("AccessDenied", 403), "credentials"),
    (_s3_error("NoSuchBucket", 404), "bucket exists"),
    (_s3_error("InvalidBucketName", 400), "bucket name"),
])
def test_permanent_errors_raise_at_once_with_the_fix(error, fix):
    flaky = _Flaky([error])
    with pytest.raises(StorageError, match=fix) as caught:
        call_with_retries(RetryPolicy(attempts=5), "write", "s3://b/k", flaky, 1, sleep=lambda s: None)
    assert flaky.calls == 1 and not caught.value.transient and "s3://b/k" in str(caught.value)


def test_passthrough_reaches_the_caller_unchanged():
    with pytest.raises(FileNotFoundError):
        call_with_retries(RetryPolicy(), "read", "u", _Flaky([FileNotFoundError("gone")]), 1,
                          passthrough=(FileNotFoundError,))
