"""Step 4 of the parallelisation order: `torch.compile` of each compile unit, in place.

A compile unit is a repeated transformer block named by the family's parts (`TransformerParts.compile_units`,
globs over `named_modules()`, e.g. `"blocks.*"`). Each unit's bound `forward` is replaced by its compiled
version (`module.forward = torch.compile(module.forward)`), not the module: the module object, its
parameter names and its hooks stay where they are, so FSDP (step 5, applied after) shards the same
parameters and its all-gather hooks run eagerly around the compiled forward, outside the graph. The
sequence-parallel routing of step 2 is inside the forward and is traced with it: its all-to-alls are
collectives in the graph (`genbatch.parallel.attention.route`: one routed processor class per kind of
block, so every block of a class reuses one graph).

Ring attention's point-to-point exchange (`Comm.exchange`, `batch_isend_irecv` and `Work.wait`) cannot be
traced (dynamo refuses P2P ops), so under `ring > 1` the units compile with `fullgraph=False`: dynamo breaks
the graph at the exchange and runs it eagerly, outside the graphs; everything else stays compiled.

Shapes: `dynamic=None` (dynamo's automatic dynamic shapes) compiles a unit class once for the first shape
and once more, with symbolic sizes, at the first shape that differs: a run of mixed resolutions and frame
counts makes at most two compiles per block class instead of one per shape. Under sequence parallel the
same holds while every split stream divides evenly over the group: the routed attention then takes its
layout from the query's symbolic size (`SequenceParallel.layout`); a job with uneven shards compiles its own
graph (its layout's lengths are constants). A batch's size (`--batch-size`) is one more size the symbolic graph
covers, except a batch of one: dynamo specialises a size of 1, so a run whose batches hold one row and more
than one (a share's last, smaller batch) compiles at most three times per block class.

`CompileClock` turns dynamo's compile start / end callbacks into timed intervals (`genbatch.runner.timing`
writes each as a `compile` row, with the block class and its input shape, and takes its seconds out of
the step it happened in).
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field

import torch

from genbatch.parallel.flags import COMPILE_BACKENDS
from genbatch.parallel.marks import ModuleMark



@dataclass(frozen=True, kw_only=True, slots=True)
class CompileConfig:
    """How the compile units are compiled."""

    backend: str = "inductor"
    """The torch.compile backend (`genbatch.parallel.flags.COMPILE_BACKENDS`)."""
    mode: str | None = None
    """inductor's mode (None, `max-autotune-no-cudagraphs`, ...); None for the other backends."""
    dynamic: bool | None = None
    """torch.compile's `dynamic`: None compiles static first and dynamic at the first new shape (at most two
    compiles per block class over mixed sizes); True compiles dynamic at once."""
    breaks: bool = False
    """True when the run needs graph breaks inside a unit (`--cache taylorseer`: its hooks on the attention and
    feed-forward modules run eagerly between the compiled parts of each block), so units compile with
    `fullgraph=False`."""

    def __post_init__(self) -> None:
        if self.backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile backend {self.backend!r} is not one of {', '.join(COMPILE_BACKENDS)}; "
                             "pass --compile-backend inductor (or aot_eager to check tracing without code generation)")
        if self.mode is not None and self.backend != "inductor":
            raise ValueError(f"a compile mode ({self.mode!r}) is inductor's; drop it or use --compile-backend inductor")


def _matches(name: str, pattern: str) -> bool:
    """A glob matched part by part: `blocks.*` matches `blocks.3` but not `blocks.3.attn1`."""
    parts, globs = name.split("."), pattern.split(".")
    return len(parts) == len(globs) and all(fnmatch.fnmatchcase(part, glob) for part, glob in zip(parts, globs))


def unit_names(module: torch.nn.Module, patterns: tuple[str, ...]) -> list[str]:
    """The names of `module`'s submodules matching any of the family's compile-unit globs, in module order."""
    return [name for name, _ in module.named_modules() if name and any(_matches(name, p) for p in patterns)]


def _contiguous(value):
    """`value` with the strides of a fresh tensor of its shape (`contiguous()` keeps the stride of a size-1
    dimension, which dynamo still guards on)."""
    if not isinstance(value, torch.Tensor) or value.stride() == torch.empty(value.shape, device="meta").stride():
        return value
    return value.clone(memory_format=torch.contiguous_format)


@dataclass(slots=True)
class CompileEvent:
    """One compile dynamo ran: when, how long, and what it compiled."""

    start: float
    """`time.perf_counter()` when it started."""
    seconds: float
    """Its wall-clock length."""
    unit: str
    """The class name of the block whose forward it compiled."""
    shape: str
    """That block's first input's shape, e.g. `1x1560x64`."""


@dataclass(slots=True)
class CompileClock:
    """Times every compile dynamo runs while installed; `take()` hands over the ones finished since the last
    call. The compiled units' forward pre-hooks note which block and shape is about to run (eagerly, before
    the compiled forward), so each compile is named by the unit and shape that caused it."""

    events: list[CompileEvent] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Compiles so far, by block class."""
    _unit: str = ""
    _shape: str = ""
    _started: float | None = None

    def install(self) -> "CompileClock":
        """Register with dynamo's compile callbacks (again after `torch._dynamo.reset()`, which drops them)."""
        handler = torch._dynamo.callback_handler
        if self._on_start not in handler.start_callbacks:
            handler.register_start_callback(self._on_start)
            handler.register_end_callback(self._on_end)
        return self

    def enter(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A compiled unit's forward pre-hook: notes the block about to run and its first input's shape, and
        hands the compiled forward contiguous tensors (the first block after a sequence split gets a strided
        view of the whole sequence, the others contiguous tensors: one graph serves both)."""
        first = args[0] if args else next(iter(kwargs.values()), None)
        self._unit = type(module).__name__.removeprefix("FSDP")
        self._shape = "x".join(map(str, first.shape)) if isinstance(first, torch.Tensor) else ""
        return tuple(map(_contiguous, args)), {key: _contiguous(value) for key, value in kwargs.items()}

    def _on_start(self, _args) -> None:
        self._started = time.perf_counter()

    def _on_end(self, _args) -> None:
        if self._started is None:
            return
        now = time.perf_counter()
        self.events.append(CompileEvent(start=self._started, seconds=now - self._started, unit=self._unit,
                                        shape=self._shape))
        self.counts[self._unit] = self.counts.get(self._unit, 0) + 1
        self._started = None

    def take(self) -> list[CompileEvent]:
        taken, self.events = self.events, []
        return taken


COMPILED: ModuleMark[bool] = ModuleMark("compiled unit")
"""Each compiled unit, and whether it was compiled whole (True: no graph break allowed)."""

CLOCK = CompileClock()
"""The process's compile clock (dynamo's callbacks are process-wide); installed by the first `compile_units`."""


def compile_units(module: torch.nn.Module, patterns: tuple[str, ...], config: CompileConfig, *,
                  fullgraph: bool = True) -> list[str]:
    """Compile the forward of each submodule of `module` matching `patterns`, in place; returns their names.
    A model whose family names units that match nothing is an error in the family (ValueError)."""
    names = unit_names(module, patterns)
    if not names:
        raise ValueError(f"{type(module).__name__} has no submodule matching its compile units {patterns}; "
                         "fix TransformerParts.compile_units in the family module, or run without --compile")
    CLOCK.install()
    options = {"backend": config.backend, "fullgraph": fullgraph, "dynamic": config.dynamic}
    if config.mode is not None:
        options["mode"] = config.mode
    for name in names:
        unit = module.get_submodule(name)
        unit.forward = torch.compile(unit.forward, **options)
        COMPILED.put(unit, fullgraph)
        unit.register_forward_pre_hook(CLOCK.enter, with_kwargs=True)
    return names
