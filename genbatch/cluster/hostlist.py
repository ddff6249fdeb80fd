"""Slurm hostlist expressions -> host names, without calling `scontrol`.

    expand_hostlist("n[1-3,7],rack[1-2]-gpu[08-09],login")
    -> ["n1", "n2", "n3", "n7", "rack1-gpu08", "rack1-gpu09", "rack2-gpu08", "rack2-gpu09", "login"]

The same expansion as `scontrol show hostnames`: comma-separated items; each item may hold several bracket
groups (`rack[1-2]-n[1-2]`: every combination, the rightmost varying fastest); a bracket holds numbers and
ranges, and a range keeps the zero padding of its lower bound (`[08-10]` -> 08, 09, 10).
"""

from __future__ import annotations

import itertools
import re

_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _split_top_level(expression: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {expression!r}: ']' without '[' at position {index}")
        elif char == "," and depth == 0:
            items.append(expression[start:index])
            start = index + 1
        if depth > 1:
            raise ValueError(f"hostlist {expression!r}: nested brackets are not hostlist syntax")
    if depth:
        raise ValueError(f"hostlist {expression!r}: '[' is never closed")
    items.append(expression[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_range(expression: str, body: str) -> list[str]:
    """`1-3,07` -> ["1", "2", "3", "07"]: the numbers of one bracket group, padding kept."""
    values = []
    for part in body.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"hostlist {expression!r}: [{body}] must hold numbers and ranges like 1-4")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"hostlist {expression!r}: range {part} runs backwards; write {high}-{low}")
        values.extend(str(number).zfill(len(low)) for number in range(int(low), int(high) + 1))
    return values


def expand_hostlist(expression: str) -> list[str]:
    """Every host name of a hostlist expression (SLURM_JOB_NODELIST), in Slurm's order."""
    hosts = []
    for item in _split_top_level(expression):
        literals = _GROUP.split(item)  # literal, group, literal, group, ..., literal
        choices = [[literal] if index % 2 == 0 else _expand_range(expression, literal)
                   for index, literal in enumerate(literals)]
        hosts.extend("".join(parts) for parts in itertools.product(*choices))
    return hosts
