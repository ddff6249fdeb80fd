from __future__ import annotations

import threading
import time

import pytest

from genbatch.io import BackgroundWriter


def test_runs_in_order_off_the_calling_thread():
    seen = []
    with BackgroundWriter(max_pending=3) as writer:
        futures = [writer.submit(lambda i: (seen.append((i, threading.current_thread().name)), i)[1], i)
                   for i in range(10)]
        writer.flush()
        assert [f.result() for f in futures] == list(range(10))
    assert [i for i, _ in seen] == list(range(10))
    assert {name for _, name in seen} == {"genbatch-writer"}


def test_submit_blocks_only_when_the_queue_is_full():
    gate = threading.Event()
    writer = BackgroundWriter(max_pending=2)
    writer.submit(gate.wait)  # taken by the thread at once
    time.sleep(0.05)
    started = time.monotonic()
    writer.submit(lambda: None)
    writer.submit(lambda: None)  # queue now holds 2
    assert time.monotonic() - started < 0.5
    blocked = threading.Thread(target=writer.submit, args=(lambda: None,))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive(), "a third waiting task must block the submitter"
    gate.set()
    blocked.join(5)
    assert not blocked.is_alive()
    writer.close()


def test_flush_reraises_the_first_error_and_keeps_going():
    done = []

    def fail(message):
        raise OSError(message)

    writer = BackgroundWriter(max_pending=4)
    writer.submit(fail, "first")
    writer.submit(fail, "second")
    later = writer.submit(done.append, "after")
    with pytest.raises(OSError, match="first"):
        writer.flush()
    assert later.result() is None and done == ["after"]
    writer.flush()  # the error was reported once
    writer.close()
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(done.append, "too late")


def test_close_reports_pending_errors_and_max_pending_is_checked():
    writer = BackgroundWriter(max_pending=1)
    writer.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.close()
    with pytest.raises(ValueError, match="max_pending"):
        BackgroundWriter(max_pending=0)


def test_exit_with_an_exception_keeps_the_bodys_error():
    with pytest.raises(KeyError):
        with BackgroundWriter() as writer:
            writer.submit(lambda: 1 / 0)
            raise KeyError("body")


def test_skip_after_error_runs_nothing_more_until_the_flush():
    ran = []
    with BackgroundWriter(max_pending=4, skip_after_error=True) as writer:
        failed = writer.submit(lambda: 1 / 0)
        later = [writer.submit(ran.append, n) for n in range(3)]
        with pytest.raises(ZeroDivisionError):
            writer.flush()
        assert ran == [] and all(f.exception() is failed.exception() for f in later)
        assert writer.failure is None  # the flush reported it
        writer.submit(ran.append, "after")
    assert ran == ["after"]


def test_failure_is_seen_without_waiting():
    with BackgroundWriter() as writer:
        assert writer.failure is None
        writer.submit(lambda: 1 / 0).exception()
        assert isinstance(writer.failure, ZeroDivisionError)
        with pytest.raises(ZeroDivisionError):
            writer.flush()
