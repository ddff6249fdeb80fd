"""Counts in messages: `counted(1, "problem")` is "1 problem", `counted(3, "problem")` "3 problems"."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, the noun plural unless the number is one (`plural`, else the noun with an s)."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
