"""PipeFusion's stages: a transformer's repeated blocks cut into `pp` contiguous stages, one per rank of the pp
axis, joined by point-to-point sends of what one block hands the next.

    cut_stages(model, parts, stage, stages)    each repeated list keeps only this stage's blocks (the rest are
                                              dropped, and with them their weights)
    StageLink(model, parts, comm)              after the splits of step 2: the stage's first block takes the
                                              previous stage's activations in place of its inputs, its last
                                              block sends its output on, and the model's output (the
                                              prediction) is broadcast from the last stage to the others

The blocks are counted over every repeated list in forward order (FLUX: its 19 double-stream blocks, then its
38 single-stream ones) and split as evenly as possible, earlier stages taking one more. Every stage runs the
model's own forward on the same inputs: its embeddings and per-forward inputs (timestep embedding, rotary
embedding, text projection) are its own, so only the carried streams (`TransformerParts.carried`) travel; the
receiving stage already knows their shapes (its own inputs to that block have them), so nothing else does.
The modules after the blocks run on every stage; only the last stage's output is the prediction.

A list may carry otherwise than the class (`TransformerParts.list_carried`: FLUX.2's single-stream blocks hand on
one joined [text, image] tensor); a stage that ends a list carrying several streams before a stage that starts one
carrying one sends them joined along the sequence, as the model joins them between the lists.
"""

from __future__ import annotations

import inspect

import torch

from genbatch.models.base import TransformerParts
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.comm import Comm
from genbatch.parallel.marks import ModuleMark

PIPELINE: ModuleMark[StageLink] = ModuleMark("pipeline stage link")
"""A cut model's `StageLink`."""
STAGE_LISTS: ModuleMark[tuple[str, str, str | None]] = ModuleMark("stage lists")
"""A cut model's repeated lists at its ends: (its first block's, its last block's, the next stage's first block's
or None on the last stage)."""
STAGE_BLOCKS: ModuleMark[dict[str, tuple[int, int]]] = ModuleMark("stage blocks")
"""A cut model's (start, stop) of its blocks in the whole model, per repeated list (its block `i` is the whole
model's `start + i`: what a checkpoint calls it)."""
TEXT = "encoder_hidden_states"
"""The carried text stream (diffusers' name in every MMDiT block): in a patch forward it travels with the first
patch of a step only, and the stages reuse it for the others."""


def stage_ranges(lengths: dict[str, int], stage: int, stages: int) -> dict[str, tuple[int, int]]:
    """This stage's blocks of each repeated list, as (start, stop) indices into the list (start == stop: none)."""
    total = sum(lengths.values())
    if stages > total:
        raise ValueError(f"--pipefusion {stages} cuts {total} blocks into more stages than blocks; use at most {total}")
    layout = SequenceLayout.split(total, stages)
    first = layout.offsets[stage]
    last = first + layout.lengths[stage]
    ranges, offset = {}, 0
    for name, length in lengths.items():
        start, stop = min(max(first - offset, 0), length), min(max(last - offset, 0), length)
        ranges[name] = (start, stop)
        offset += length
    return ranges


def _lists(model: torch.nn.Module, parts: TransformerParts) -> dict[str, torch.nn.ModuleList]:
    return {name: model.get_submodule(name) for name in parts.blocks.repeated}


def cut_stages(model: torch.nn.Module, parts: TransformerParts, stage: int, stages: int) -> list[torch.nn.Module]:
    """Keep only this stage's blocks in each repeated list; returns them in forward order."""
    if not parts.carried and not parts.list_carried:
        raise ValueError(f"{type(model).__name__} has no pipeline stages; run it with --pipefusion 1")
    lists = _lists(model, parts)
    lengths = {name: len(blocks) for name, blocks in lists.items()}
    ranges = stage_ranges(lengths, stage, stages)
    STAGE_BLOCKS.put(model, ranges)
    held = [name for name, (start, stop) in ranges.items() if start < stop]
    following = None
    if stage + 1 < stages:
        following = next(name for name, (start, stop) in stage_ranges(lengths, stage + 1, stages).items()
                         if start < stop)
    STAGE_LISTS.put(model, (held[0], held[-1], following))
    kept = []
    for name, blocks in lists.items():
        start, stop = ranges[name]
        owner, _, attribute = name.rpartition(".")
        parent = model.get_submodule(owner) if owner else model
        setattr(parent, attribute, torch.nn.ModuleList(list(blocks)[start:stop]))
        kept.extend(list(blocks)[start:stop])
    return kept


def stage_name(model: torch.nn.Module, key: str) -> str | None:
    """A whole model's tensor name (a checkpoint key) as this stage's model names it, or None when the stage
    does not hold it (a block of another stage); unchanged for a model that is not cut."""
    ranges = STAGE_BLOCKS.get(model)
    if not ranges:
        return key
    for name, (start, stop) in ranges.items():
        head = f"{name}."
        if key.startswith(head):
            index, _, rest = key[len(head):].partition(".")
            if not index.isdigit():
                return key
            if not start <= int(index) < stop:
                return None
            return f"{head}{int(index) - start}.{rest}"
    return key


def _input_positions(block: torch.nn.Module, names: tuple[str, ...]) -> dict[str, int]:
    params = list(inspect.signature(block.forward).parameters)
    return {name: params.index(name) for name in names if name in params}


class StageLink:
    """The point-to-point joins of one cut model; `remove()` takes the hooks off."""

    def __init__(self, model: torch.nn.Module, parts: TransformerParts, blocks: list[torch.nn.Module], comm: Comm):
        first_list, last_list, next_list = STAGE_LISTS.get(model)
        self.comm, self.carried = comm, parts.carried_by(first_list)
        """What this stage's first block takes from the previous stage."""
        self.sent = parts.carried_by(last_list)
        """What this stage's last block hands on."""
        following = parts.carried_by(next_list) if next_list is not None else self.sent
        self.joined = following[0] if len(following) == 1 and len(self.sent) > 1 else None
        """The one stream the next stage takes where this stage's several are joined for it (or None)."""
        if self.joined is None and following != self.sent:
            raise ValueError(f"{type(model).__name__}: a stage boundary between {last_list} (carrying {self.sent}) "
                             f"and {next_list} (carrying {following}) cannot be joined; fix its TransformerParts")
        self.stage, self.stages = comm.rank, comm.size
        self.pending: list = []
        self.handles = []
        self.state = None
        """The job's `PipeState` (None: whole forwards only)."""
        self.text: dict[str, torch.Tensor] = {}
        """The text stream received with a step's first patch, by branch."""
        first, last = blocks[0], blocks[-1]
        if self.stage > 0:
            positions = _input_positions(first, self.carried)
            self.handles.append(first.register_forward_pre_hook(self._receiver(positions), with_kwargs=True))
        if self.stage < self.stages - 1:
            self.handles.append(last.register_forward_hook(self._send))
        self.handles.append(model.register_forward_hook(self._return_prediction))
        PIPELINE.put(model, self)

    def _receiver(self, positions: dict[str, int]):
        def receive(block, args, kwargs):
            args = list(args)
            patch = None if self.state is None else self.state.patch
            for name in self.carried:
                where = kwargs if name in kwargs else None
                like = kwargs[name] if where is not None else args[positions[name]]
                if name == TEXT and patch:  # a later patch of the step: the text came with the first
                    received = self.text[self.state.branch]
                else:
                    received = torch.empty_like(like, memory_format=torch.contiguous_format)
                    self.comm.recv(received, self.stage - 1)
                    if name == TEXT and patch == 0:
                        self.text[self.state.branch] = received
                if where is not None:
                    kwargs[name] = received
                else:
                    args[positions[name]] = received
            return tuple(args), kwargs

        return receive

    def flush(self) -> None:
        """Wait for the sends in flight (those of the forward before: a stage never blocks on its own sends
        within a forward, so the next stage can be one patch behind)."""
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()

    def _send(self, block, args, output):
        self.flush()
        items = output if isinstance(output, tuple) else (output,)
        patch = None if self.state is None else self.state.patch
        names = self.sent
        if self.joined is not None:
            # e.g. (b, n_text, d) + (b, n_image, d) -> (b, n_text + n_image, d), as the model joins them
            items, names = (torch.cat(items, dim=1),), (self.joined,)
        for name, value in zip(names, items, strict=True):
            if name == TEXT and patch:
                continue  # sent once a step, with the first patch
            value = value.contiguous()
            kind = "pp_text" if name == TEXT else "pp_activation"
            self.pending.append((self.comm.send(value, self.stage + 1, kind=kind), value))
        return output

    def _return_prediction(self, model, args, output):
        if self.state is not None and self.state.patch is not None:
            return output  # a patch's prediction stays on the last stage, which steps it
        items = list(output) if isinstance(output, tuple) else [output.sample]
        prediction = items[0].contiguous()
        self.comm.broadcast(prediction, self.stages - 1, kind="pp_latent")
        if isinstance(output, tuple):
            return (prediction, *items[1:])
        output.sample = prediction
        return output

    def remove(self) -> None:
        self.flush()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
