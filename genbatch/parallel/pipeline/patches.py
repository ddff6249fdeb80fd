"""The hooks that make one forward a patch forward: at the sequence splits' split points an image stream keeps
the running patch's tokens (before the sequence-parallel split cuts them over the stage's ranks), and at its
gather points the gathered patch goes back to its place in a whole-length output (`PipeState.cut` / `place`).

They read the model's `PipeState` (set per job by the session); with none, or outside a patch, they pass
every value through.
"""

from __future__ import annotations

import fnmatch

import torch

from genbatch.parallel.marks import ModuleMark
from genbatch.parallel.pipeline.state import PipeState
from genbatch.parallel.routing import sequence_routing
from genbatch.parallel.sequence import hook_split_points

PATCHES: ModuleMark[PatchHooks] = ModuleMark("pipefusion patch hooks")
"""A PipeFusion denoiser's `PatchHooks`."""


class PatchHooks:
    def __init__(self, model: torch.nn.Module):
        self.state: PipeState | None = None
        self.handles = []
        routing, points = sequence_routing(model)
        self.output_stream, self.text_streams = routing.output_stream, frozenset(routing.text_streams)
        named = list(model.named_modules())
        for key, spec in points.items():
            for name, module in ((name, module) for name, module in named if fnmatch.fnmatchcase(name, key)):
                if isinstance(spec, dict):  # before the sequence-parallel split, which then cuts the patch
                    self.handles += hook_split_points(name, module, spec, self._cut, prepend=True)
                else:  # after the sequence-parallel gather, which brought the patch back whole
                    self.handles.append(module.register_forward_hook(self._placer(spec)))

    def _cut(self, tensor, dim, stream):
        return tensor if self.state is None else self.state.cut(tensor, dim, stream)

    def _placer(self, spec):
        def place(module, args, output):
            if self.state is None or (spec.expected_dims and output.ndim != spec.expected_dims):
                return output
            return self.state.place(output, spec.gather_dim, self.output_stream)

        return place

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
