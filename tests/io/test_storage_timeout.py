"""--storage-timeout: one storage operation, every retry layer included (genbatch's loop, s3fs's, botocore's
retries and socket timeouts), gives up within its bound, against endpoints that refuse or never answer."""

from __future__ import annotations

import socket
import time

import pytest

from genbatch.io import RetryPolicy, RunStore, StorageError
from genbatch.io.objects import DOWN_TRY_S
from genbatch.io.retry import call_with_retries
from tests.support.distributed import free_port

SLACK_S = 2.5  # event-loop hand-offs and a loaded 2-core machine


def _options(endpoint_url: str) -> dict:
    return {"key": "testing", "secret": "testing", "endpoint_url": endpoint_url,
            "client_kwargs": {"region_name": "us-east-1"}}


@pytest.fixture
def silent_endpoint():
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a hung server."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_retries_stop_at_the_deadline_and_each_try_gets_the_time_left():
    clock, bounds = _Clock(), []

    def down(**kwargs):
        bounds.append(kwargs["timeout"])
        clock.now += 0.5  # each try takes half a second to fail
        raise ConnectionResetError("reset")

    policy = RetryPolicy(timeout_s=10.0, base_delay_s=0.1, max_delay_s=2.0)
    with pytest.raises(StorageError, match=r"failed after \d+ tries in .* \(--storage-timeout 10 s\)") as caught:
        call_with_retries(policy, "write", "s3://b/k", down, bound="timeout", sleep=clock.sleep, clock=clock)
    assert caught.value.transient
    assert clock.now <= 10.0 + 0.5  # the last try started before the deadline, no wait crossed it
    assert len(bounds) > 6  # the default policy is bounded by time, not by a handful of tries
    assert bounds[0] == 10.0 and bounds == sorted(bounds, reverse=True) and bounds[-1] > 0


def test_a_policy_needs_a_bound():
    with pytest.raises(ValueError, match="timeout_s"):
        RetryPolicy(timeout_s=0)
    with pytest.raises(ValueError, match="bound"):
        RetryPolicy(timeout_s=None, attempts=None)


def test_refusing_endpoint_fails_within_the_bound_naming_url_and_option():
    store = RunStore("s3://bucket/run", _options(f"http://127.0.0.1:{free_port()}"), retry=RetryPolicy(timeout_s=2))
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        store.commit("j", b"media", "png", {})
    elapsed = time.monotonic() - started
    assert 1.0 < elapsed < 2 + SLACK_S, "the bound is time: retried until near it, never past it"
    message = str(caught.value)
    assert caught.value.transient and "s3://bucket/run/done/j.json" in message and "--storage-timeout 2 s" in message


def test_silent_endpoint_cannot_hold_a_try_past_the_bound(silent_endpoint):
    """botocore alone would wait 60 s per read (its read_timeout) and s3fs would retry that 5 times."""
    store = RunStore("s3://bucket/run", _options(silent_endpoint), retry=RetryPolicy(timeout_s=2))
    assert store.fs.retries == 1 and store.fs.config_kwargs["read_timeout"] == 2
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        store.save_checkpoint("j", b"latents")
    assert time.monotonic() - started < 2 + SLACK_S
    assert caught.value.transient


def test_a_store_found_down_tries_once_and_briefly_per_later_operation(silent_endpoint):
    """The run is stopping: its last writes (timings) must not each wait out the bound again."""
    store = RunStore("s3://bucket/run", _options(silent_endpoint), retry=RetryPolicy(timeout_s=3))
    with pytest.raises(StorageError):
        store.save_checkpoint("j", b"latents")
    assert store.objects.down
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"after 1 try\b.*the store is down since: write .*/j.ckpt failed"):
        store.delete_checkpoint("j")
    assert time.monotonic() - started < DOWN_TRY_S + 1.5  # well under the 3 s bound


def test_socket_timeouts_follow_the_bound_unless_given():
    short = RunStore("s3://bucket/run", _options("http://127.0.0.1:1"), retry=RetryPolicy(timeout_s=5))
    assert short.fs.config_kwargs["connect_timeout"] == 5 and short.fs.config_kwargs["read_timeout"] == 5
    default = RunStore("s3://bucket/run", _options("http://127.0.0.1:1"))
    assert default.retry.timeout_s == 120 and default.fs.config_kwargs["read_timeout"] == 60
    given = RunStore("s3://bucket/run", {**_options("http://127.0.0.1:1"), "config_kwargs": {"read_timeout": 7}},
                     retry=RetryPolicy(timeout_s=5))
    assert given.fs.config_kwargs["read_timeout"] == 7 and given.fs.config_kwargs["connect_timeout"] == 5
