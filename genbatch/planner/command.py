"""The command that runs a plan's best layout: `gen run` on one node (`--nproc`), `gen submit` on several, with
the flags that give the layout and the choices the plan priced, ready to paste.

    gen run MANIFEST --out OUT --model flux.1-dev --nproc 4 --ulysses 2 --fsdp

`dp` is left out (gen run gives it the ranks the other axes leave); `--vae-decode` is given when the plan chose
another mode than `gen run --vae-decode auto` would try first with the memory to spare (parallel over a group of
two or more, full on one rank), and `--batch-size` when the plan priced more than one row a forward.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from genbatch.parallel.dims import ParallelDims
from genbatch.planner.layouts import run_flags
from genbatch.planner.rank import Plan

MANIFEST = "MANIFEST"
"""The manifest's place in the printed command: the user's own."""
OUT = "OUT"
"""The output's place in the printed command."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCommand:
    """What runs the best layout: `gen run` or `gen submit`, and its flags after `MANIFEST --out OUT`."""

    command: str
    """`run` (one node: `--nproc` starts the ranks) or `submit` (several nodes: an sbatch job)."""
    flags: tuple[str, ...]
    """The flags, each word its own item, as a shell would split them."""

    @property
    def args(self) -> tuple[str, ...]:
        """The whole argument list after `gen`, with the placeholders `MANIFEST` and `OUT`."""
        return (self.command, MANIFEST, "--out", OUT, *self.flags)

    def line(self) -> str:
        """The command as one shell line: `gen run MANIFEST --out OUT --model ... --nproc 4 ...`."""
        return shlex.join(("gen", *self.args))

    def to_dict(self) -> dict:
        return {"command": self.command, "flags": list(self.flags), "line": self.line()}


def first_exact_mode(layout: ParallelDims) -> str:
    """The decode mode `gen run --vae-decode auto` tries first: parallel over a group of two or more, else full."""
    return "parallel" if layout.group_size > 1 else "full"


def run_command(plan: Plan, model: str) -> RunCommand:
    """The command that runs `plan`'s best layout for `model` (the name given to `gen plan`); ValueError naming
    the limits when no layout is runnable."""
    best = plan.best
    layout, cluster = best.layout, plan.cluster
    flags: list[str] = ["--model", model]
    if cluster.nodes == 1:
        command = "run"
        flags += ["--nproc", str(cluster.gpus)] if cluster.gpus > 1 else []
    else:
        command = "submit"
        flags += ["--nodes", str(cluster.nodes), "--gpus-per-node", str(cluster.gpus_per_node)]
    flags += run_flags(layout)
    mode = best.estimate.decode_mode
    if mode != first_exact_mode(layout):
        flags += ["--vae-decode", mode]
    if plan.work.batch > 1:
        flags += ["--batch-size", str(plan.work.batch)]
    return RunCommand(command=command, flags=tuple(flags))
