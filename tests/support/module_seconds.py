"""The seconds each test took, by which `make test` and `make test-slow` hand out their modules heaviest first
(tests/conftest.py).

`--dist loadfile` gives a worker a whole module at a time, in the order the modules arrive. Handed out in file
order or by test count, a heavy module drawn last keeps one worker busy while the other idles; heaviest first,
the light ones fill in at the end. A module weighs the seconds of the tests the run selected (`make test`'s and
`make test-slow`'s differ), read from runs' `--durations=0` reports and kept in tests/module_seconds.json; a
test missing from it counts `UNKNOWN_TEST_SECONDS`.

    python -m tests.support.module_seconds LOG [LOG ...]    # add these logs' figures to tests/module_seconds.json
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_seconds.json")
UNKNOWN_TEST_SECONDS = 0.05
"""What a test the file does not list is taken to cost: pytest's report leaves out tests under 5 ms, and a new
test is taken for a light one until the file is made again."""
_LINE = re.compile(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(tests/\S+\.py::.+?)\s*$")


def read_logs(paths: list[str]) -> dict[str, float]:
    """Test id -> the seconds of its setup, call and teardown, summed over `--durations=0` reports."""
    seconds: collections.Counter = collections.Counter()
    for path in paths:
        with open(path) as handle:
            for line in handle:
                match = _LINE.match(line)
                if match:
                    seconds[match.group(2)] += float(match.group(1))
    return dict(seconds)


def load() -> dict[str, float]:
    """The recorded seconds by test id; empty when the file is missing."""
    try:
        with open(PATH) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def heaviest_first(items: list) -> list:
    """Pytest's `items`, their modules heaviest first by `load()`'s seconds (a module's tests keep their order)."""
    seconds = load()
    modules = {item.nodeid: item.nodeid.split("::")[0] for item in items}
    weight: collections.Counter = collections.Counter()
    for item in items:
        weight[modules[item.nodeid]] += seconds.get(item.nodeid, UNKNOWN_TEST_SECONDS)
    return sorted(items, key=lambda item: -weight[modules[item.nodeid]])  # stable: in-module order kept


def main(paths: list[str]) -> None:
    if not paths:
        raise SystemExit(__doc__)
    seconds = {**load(), **read_logs(paths)}
    with open(PATH, "w") as handle:
        json.dump({name: round(value, 2) for name, value in sorted(seconds.items())}, handle, indent=0)
        handle.write("\n")
    print(f"{PATH}: {len(seconds)} tests, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
