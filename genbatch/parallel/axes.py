"""The axis table: every mesh axis declared once, outermost first, and the rules for combining them (imports
nothing heavy).

    dp  x  cfg  x  distrifusion  x  pp  x  ring  x  ulysses  x  tp       (tp varies fastest: consecutive ranks)

`dp` groups run different jobs; the other axes together are one *job group*, the ranks that run one job.
Tensor parallelism is innermost (its all-reduces a layer want the fastest links, as in xDiT's rank
order), then Ulysses (all-to-all inside a node), then Ring and PipeFusion stages (`pp`), which tolerate slower
links, then DistriFusion's patches, whose K/V all-gathers hide behind a step of compute, then the two CFG
branches, which exchange one prediction a step. FSDP shards weights over a named sub-mesh: by default the job
group's axes whose ranks hold the same weights (`Axis.fsdp_shards`: all but tp and pp).

What reads this table: `gen run`'s and `gen plan`'s flags (`parallel/flags.py`), `ParallelDims` (its fields,
`infer`, its name grammar), `LayoutConstraints`, run.json, and the planner's enumeration. `layout_problems`
is the one rule set for which axes combine: the runner's start-up check and the planner's enumeration both
apply it, so the planner ranks every layout the runner runs and none that it refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    name: str
    """The axis's name in the mesh, in layout names (`ulysses4`) and in `gen run --NAME`."""
    short: str
    """Its column heading in `gen plan`'s table."""
    collective: str | None
    """The byte ledger's collective kind it sends (`bytes_KIND` in the timings; None: it sends nothing a step)."""
    what: str
    """One line for messages (and `gen plan`'s help)."""
    help: str
    """`gen run --NAME`'s help."""
    aliases: tuple[str, ...] = ()
    """Further spellings of the flag (`--pipefusion` for `--pp`)."""
    max_degree: int | None = None
    """The largest degree it takes (cfg: 2 branches), None when any."""
    fsdp_shards: bool = True
    """True when FSDP shards over this axis by default: its ranks hold the same weights (tp's and pp's do not)."""
    stale: str | None = None
    """The stale-attention method this axis is (its ranks attend to K/V a step old), None for an exact axis."""
    alone_with: tuple[str, ...] | None = None
    """The only other axes it composes with (None: any)."""
    with_fsdp: bool = True
    """False when FSDP does not compose with it."""
    why_alone: str = ""
    """Why it composes with `alone_with` only, or not with FSDP: for the message."""


_AXES = (
    Axis(name="dp", short="dp", collective=None, what="data parallel: groups that run different jobs",
         help="Data-parallel groups (default: the rest of the world)."),
    Axis(name="cfg", short="cfg", collective="cfg_exchange", what="CFG parallel: the two guidance branches on different ranks", max_degree=2,
         help="CFG parallel: 2 runs the two guidance branches on different ranks."),
    Axis(name="distrifusion", short="df", collective="stale_kv", what="DistriFusion: one patch per rank, every layer's K/V all-gathered a step late",
         help="DistriFusion: each rank one patch of the latent, every layer's K/V of the others all-gathered "
              "asynchronously and used a step late; composes with --cfg and --dp only.",
         stale="DistriFusion", alone_with=("cfg", "dp"), with_fsdp=False,
         why_alone="DistriFusion keeps every layer whole on every rank and gives each rank one patch: the other "
                   "axes would split the layers, heads or patch again"),
    Axis(name="pp", short="pp", collective="p2p", what="PipeFusion stages: layers split into stages, patches streamed through them",
         help="PipeFusion stages: the layers split over P ranks, patches of the latent streamed through them.",
         aliases=("--pipefusion",), fsdp_shards=False, stale="PipeFusion"),
    Axis(name="ring", short="ring", collective="p2p", what="Ring attention: K/V blocks passed around a ring", help="Ring-attention degree."),
    Axis(name="ulysses", short="uly", collective="all_to_all", what="Ulysses: heads exchanged by all-to-all",
         help="Ulysses degree (must divide the head count)."),
    Axis(name="tp", short="tp", collective="all_reduce", what="tensor parallel: weights split by heads and MLP columns", fsdp_shards=False,
         help="Tensor-parallel degree: heads and MLP columns split over consecutive ranks (ulysses x tp must "
              "divide the head count)."),
)

AXES: tuple[str, ...] = tuple(axis.name for axis in _AXES)
"""Mesh axes, outermost first."""
AXIS: dict[str, Axis] = {axis.name: axis for axis in _AXES}
GROUP_AXES: tuple[str, ...] = AXES[1:]
"""The axes of one job group (every axis but dp)."""
SP_AXES: tuple[str, ...] = ("ring", "ulysses")
"""The sequence-parallel axes (USP: ring outside, ulysses inside)."""
STALE_AXES: dict[str, str] = {axis.name: axis.stale for axis in _AXES if axis.stale}
"""The stale-attention axes and their methods' names."""
DEFAULT_FSDP_AXES: tuple[str, ...] = tuple(axis.name for axis in _AXES[1:] if axis.fsdp_shards)
"""What FSDP shards over by default: the job group's axes whose ranks hold the same weights."""


def degree_problems(degrees: Mapping[str, int]) -> list[str]:
    """What is wrong with each degree on its own (below 1, above its axis's largest), naming the flag."""
    problems = []
    for name in AXES:
        value, largest = degrees.get(name, 1), AXIS[name].max_degree
        if value < 1:
            problems.append(f"--{name} {value} must be at least 1")
        elif largest is not None and value > largest:
            problems.append(f"--{name} {value}: {AXIS[name].what}, so it is at most {largest}")
    return problems


QUANTIZED_SPLIT = ("torchao's quantized weights (Float8Tensor, Int8Tensor) do not split under DTensor or shard under "
                   "fully_shard")
"""Why a quantized run refuses tp and fsdp (`genbatch.parallel.quantize`)."""


def quantization_problems(degrees: Mapping[str, int], *, fsdp: bool, quantization: str) -> list[str]:
    """Why a quantized run (`--quantization fp8|int8`) cannot have these degrees: tensor parallelism splits weights
    as DTensors and FSDP shards them with `fully_shard`, and neither takes torchao's tensors."""
    if quantization in (None, "none"):
        return []
    problems = []
    if degrees.get("tp", 1) > 1:
        problems.append(f"--tp {degrees['tp']} with --quantization {quantization}: {QUANTIZED_SPLIT}; give these "
                        "ranks to --ulysses or --ring (the quantized weights fit whole on each), or run "
                        "--quantization none")
    if fsdp:
        problems.append(f"--fsdp with --quantization {quantization}: {QUANTIZED_SPLIT}; drop --fsdp (each rank then "
                        "holds the quantized weights whole: half of bf16), or run --quantization none")
    return problems


def layout_problems(degrees: Mapping[str, int], *, fsdp: bool, cache: bool = False,
                    quantization: str = "none") -> list[str]:
    """Why these degrees cannot run together, whatever the model (empty when they can): the one rule set that
    `gen run`'s start-up and `gen plan`'s enumeration share. `cache`: a step cache (`--cache`) is on;
    `quantization`: the run's `--quantization` (`genbatch.jobs.quantization`). Each problem names the flags and
    a fix."""
    problems = degree_problems(degrees)
    above = [name for name in AXES if degrees.get(name, 1) > 1]
    for name in above:
        axis = AXIS[name]
        others = [] if axis.alone_with is None else [
            f"--{other} {degrees[other]}" for other in above if other != name and other not in axis.alone_with]
        if fsdp and not axis.with_fsdp:
            others.append("--fsdp")
        if others:
            fix = "drop --fsdp" if axis.alone_with is None else (
                f"combine it with {' and '.join(f'--{other}' for other in axis.alone_with)} only, or use --ulysses / "
                "--ring (exact sequence parallel) for these ranks instead")
            problems.append(f"--{name} {degrees[name]} does not compose with {', '.join(others)} ({axis.why_alone}); "
                            f"{fix}")
        if axis.stale and cache:
            problems.append(f"--cache with --{name} {degrees[name]}: step caching does not run with {axis.stale}'s "
                            "stale K/V (a skipped step would leave its buffers a step further behind); use "
                            f"--cache none or --{name} 1")
    problems += quantization_problems(degrees, fsdp=fsdp, quantization=quantization)
    if fsdp and fsdp_ranks(degrees) < 2:
        held = ("this layout's job groups have one rank each" if math.prod(degrees.get(name, 1) for name in GROUP_AXES) < 2
                else "in this layout each weight is held by one rank of its job group (its --tp and --pp ranks hold "
                "different weights), so FSDP would shard over one rank, which changes nothing")
        problems.append("--fsdp shards weights over a job group's ranks that hold the same weights (all but --tp "
                        f"and --pp), and {held}; drop --fsdp, or give each job group such ranks (e.g. --ulysses 2, "
                        "--ring 2 or --cfg 2)")
    return problems


def fsdp_ranks(degrees: Mapping[str, int]) -> int:
    """The ranks FSDP shards each weight over by default: the product of the `DEFAULT_FSDP_AXES` degrees (the
    job group minus tp and pp). Below 2 there is nothing to shard, and `layout_problems` refuses `--fsdp`."""
    return math.prod(degrees.get(name, 1) for name in DEFAULT_FSDP_AXES)
