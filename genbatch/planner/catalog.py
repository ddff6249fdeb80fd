"""Every model name `--model` takes, as `gen models` lists it: each family's tiny presets and published models
(`genbatch.models.catalog`), and the models the planner prices but no family runs (`plan only`: the planner's
published shapes of a family genbatch does not have).

The text table groups the names by family, in the families' order, and fits in 100 columns: a published model's
hub id is on the line below its name. docs/models.md holds this table as `gen models` prints it (a test keeps the
two equal).
"""

from __future__ import annotations

from genbatch.models import families
from genbatch.models.catalog import CatalogEntry, entry, family_entries
from genbatch.planner.shapes import PUBLISHED

PLAN_ONLY = "plan only"
"""The kind of a model `gen plan` prices and no family runs (`CatalogEntry.kind`)."""
WIDTH = 100
"""The text table's widest line."""
HEADINGS = ("NAME", "KIND", "TASK", "GUIDANCE", "SIZE", "STEPS")
"""The text table's columns (SIZE: width x height, x frames for a video)."""


def catalog() -> list[CatalogEntry]:
    """Every name: the families' presets and published models (`family_entries`), then the planned-only models."""
    runnable = families()
    planned = [entry(shape, kind=PLAN_ONLY, hub_id=shape.hub_id, transformer={})
               for shape in PUBLISHED.values() if shape.family not in runnable]
    return [*family_entries(), *planned]


def _cells(item: CatalogEntry) -> tuple[str, ...]:
    return (item.name, item.kind, item.task, item.guidance_text, item.size,
            "-" if item.steps is None else str(item.steps))


def catalog_lines(entries: list[CatalogEntry]) -> list[str]:
    """The text table of `entries`: a heading, then per family its name (and the pipelines that run it) and one line
    per name, a published model's hub id on the next line."""
    rows = [_cells(item) for item in entries]
    widths = [max(len(cells[column]) for cells in [HEADINGS, *rows]) for column in range(len(HEADINGS))]

    def line(cells: tuple[str, ...]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths[:-1], strict=True)]
        return ("  " + "  ".join([*padded, cells[-1].rjust(widths[-1])])).rstrip()

    runnable = families()
    lines = [line(HEADINGS)]
    family = None
    for item, cells in zip(entries, rows, strict=True):
        if item.family != family:
            family = item.family
            pipelines = ", ".join(runnable[family].pipelines) if family in runnable else "no family runs it"
            lines.append(f"{family} ({pipelines})")
        lines.append(line(cells))
        if item.hub_id:
            lines.append(f"    hub id {item.hub_id}")
    too_wide = [text for text in lines if len(text) > WIDTH]
    if too_wide:
        raise ValueError(f"gen models' table is wider than {WIDTH} columns: {too_wide[0]!r}; shorten a task or "
                         "guidance label (genbatch.models.catalog)")
    return lines


__all__ = ["HEADINGS", "PLAN_ONLY", "WIDTH", "catalog", "catalog_lines"]
