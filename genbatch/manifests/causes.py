"""Rejected rows grouped by cause: one line per (column, reason) with its row count and the first few rows (each
with its subject, where the reason is about the row's own value: `3 rows: column 'image': no such file; ...
(row 2 (id 'a'): /data/a.png, ...)`).

A cause shared by many rows (a `model` column naming a missing directory, a size every row leaves to a bad
default) is said once, not once per row; the full list stays in `OUT/rejected/` and `gen validate --json`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from genbatch.jobs.counts import counted
from genbatch.manifests.validate import Rejection

SHOWN_ROWS = 3
"""Rows named in a cause's line before "and N more"."""


def _who(row: int, job_id: str | None, subject: str | None = None) -> str:
    return f"row {row} ({f'id {job_id!r}' if job_id else 'no id'})" + ("" if subject is None else f": {subject}")


@dataclass(kw_only=True, slots=True)
class Cause:
    """One problem shared by one or more rejected rows."""

    column: str
    """The column at fault."""
    reason: str
    """What is wrong and how to fix it (the same for every row of the cause)."""
    rows: int = 0
    """Rows rejected for this cause."""
    first: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    """(row index, id, subject) of the first `SHOWN_ROWS` rows, in manifest order (the subject: the row's own
    value the reason is about, such as its missing image's URL; None when the reason says it all)."""

    def message(self) -> str:
        """One row: exactly `Rejection.message()`; several: `2000 rows: column 'model': ... (row 0 (id 'a'),
        row 1 (id 'b'), row 2 (id 'c') and 1997 more)`."""
        if self.rows == 1:
            row, job_id, subject = self.first[0]
            reason = self.reason if subject is None else f"{subject}: {self.reason}"
            return f"{_who(row, job_id)}: column {self.column!r}: {reason}"
        named = ", ".join(_who(*first) for first in self.first)
        more = f" and {self.rows - len(self.first)} more" if self.rows > len(self.first) else ""
        return f"{self.rows} rows: column {self.column!r}: {self.reason} ({named}{more})"


def group_causes(rejections: Iterable[Rejection]) -> list[Cause]:
    """The distinct causes of `rejections`, in order of first appearance."""
    causes: dict[tuple[str, str], Cause] = {}
    for rejection in rejections:
        key = (rejection.column, rejection.reason)
        cause = causes.get(key)
        if cause is None:
            cause = causes[key] = Cause(column=rejection.column, reason=rejection.reason)
        cause.rows += 1
        if len(cause.first) < SHOWN_ROWS:
            cause.first.append((rejection.row, rejection.job_id, rejection.subject))
    return list(causes.values())


def cause_lines(rejections: Iterable[Rejection], shown: int | None = None) -> list[str]:
    """One line per cause (the first `shown` of them when given, then how many more there are)."""
    causes = group_causes(rejections)
    kept = causes if shown is None else causes[:shown]
    lines = [cause.message() for cause in kept]
    if len(causes) > len(kept):
        lines.append(f"... and {counted(len(causes) - len(kept), 'more cause')}")
    return lines
