"""The suite's modules come heaviest first by their selected tests' recorded seconds, each module's tests in their
own order (tests/support/module_seconds.py), and the figures are read from `--durations=0` reports."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support import module_seconds


@dataclass
class _Item:
    nodeid: str


def test_modules_come_heaviest_first_with_their_tests_in_order(monkeypatch):
    seconds = {"tests/a.py::one": 1.0, "tests/a.py::two": 1.0, "tests/b.py::slow": 30.0, "tests/c.py::one": 5.0}
    monkeypatch.setattr(module_seconds, "load", lambda: seconds)
    items = [_Item(name) for name in ("tests/a.py::one", "tests/a.py::two", "tests/b.py::fast", "tests/c.py::one",
                                      "tests/d.py::new")]
    # b's selected test is not its heavy one: b weighs UNKNOWN_TEST_SECONDS, under a's 2 s and c's 5 s
    assert [item.nodeid for item in module_seconds.heaviest_first(items)] == [
        "tests/c.py::one", "tests/a.py::one", "tests/a.py::two", "tests/b.py::fast", "tests/d.py::new"]


def test_the_figures_are_read_from_durations_reports(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("============ slowest durations ============\n"
                   "12.50s call     tests/x/test_a.py::test_one[p-1]\n"
                   "0.40s setup    tests/x/test_a.py::test_one[p-1]\n"
                   "0.01s teardown tests/x/test_b.py::test_two\n"
                   "1415 passed in 616.57s (0:10:16)\n")
    assert module_seconds.read_logs([str(log)]) == {"tests/x/test_a.py::test_one[p-1]": 12.9,
                                                     "tests/x/test_b.py::test_two": 0.01}
