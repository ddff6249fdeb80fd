"""The run's progress bar (rank 0, on a terminal) and its end-of-run summary."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from tqdm import tqdm


@dataclass(slots=True)
class RunProgress:
    total: int
    """Jobs this run is responsible for (valid rows of its share)."""
    already_done: int
    """Jobs this run leaves alone: done by earlier attempts, or failed in too many (`given_up`)."""
    enabled: bool
    given_up: int = 0
    """Of those, the jobs not tried again for having failed in --max-attempts runs."""
    bar: tqdm | None = field(default=None)

    def __post_init__(self) -> None:
        if self.enabled:
            # disable=None: a bar on a terminal, nothing when stderr is a file or a pipe.
            self.bar = tqdm(total=self.total, initial=self.already_done, unit="job", desc="gen run",
                            dynamic_ncols=True, disable=None, file=sys.stderr)

    def job_finished(self, store, run_id: str, ctx, count: int = 1) -> None:
        """Count `count` finished jobs (a batch's; group leaders) and move the bar to the run-wide count (rank 0)."""
        key = f"genbatch/{run_id}/finished"
        if ctx.is_leader:
            store.add(key, count)
        if self.bar is not None:
            finished = store.add(key, 0)
            self.bar.update(self.already_done + finished - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def print_summary(self, summary: dict, *, wall_seconds: float, out: str) -> None:
        parts = [f"{summary.get(key, 0)} {key}" for key in ("done", "failed", "rejected")]
        parts.append(f"{self.already_done - self.given_up} skipped (done before)")
        if self.given_up:
            parts.append(f"{self.given_up} not tried again (failed in --max-attempts runs)")
        print(f"genbatch: {', '.join(parts)} in {wall_seconds:.1f} s -> {out}", file=sys.stderr)
        if summary.get("failed"):
            print(f"genbatch: `gen status {out} --failed` lists the failed jobs and why; a rerun of the same command "
                  "tries them again", file=sys.stderr)
