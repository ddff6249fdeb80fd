"""Bytes another library's collectives send, counted from outside: torch.distributed's entry points wrapped.

genbatch counts what it sends itself (`genbatch.parallel.comm`); a peer such as diffusers' own parallelism
calls torch.distributed directly, through its functional collectives (`funcol.all_to_all_single`,
`funcol.all_gather_tensor`, DTensor's `funcol.all_reduce`, ...) or the plain ones (`dist.all_gather`).
`CollectiveBytes` replaces those module attributes with counting wrappers while it is installed, so a caller
that looks them up at call time (`funcol.all_to_all_single(...)`, as diffusers and DTensor do) is counted
without a change to its code, at the cost of one Python call per collective (nothing per tensor op).

Each call counts the bytes this rank puts on the wire under the same rules as genbatch's ledger:

| kind            | bytes this rank sends                                   |
|-----------------|---------------------------------------------------------|
| all_to_all      | its input minus the part it keeps                       |
| all_gather      | its input, once to each of the p-1 others               |
| all_reduce      | 2 (p-1)/p of the tensor (ring reduce-scatter + gather)  |
| reduce_scatter  | (p-1)/p of its input                                    |
| broadcast       | the tensor once to each other rank, on the source only  |
| p2p             | the tensor                                              |

Only the outermost collective of a nested call counts (`all_gather_tensor` calls `all_gather_single`). Counting
is on only while `counting` is true, so a caller can count the denoising steps alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# torch.distributed._functional_collectives: name -> (kind, index of the group argument; the tensor is the first)
_FUNCTIONAL = {
    "all_to_all_single": ("all_to_all", 3), "all_to_all_single_autograd": ("all_to_all", 3),
    "all_gather_tensor": ("all_gather", 2), "all_gather_single": ("all_gather", 2),
    "all_gather_tensor_autograd": ("all_gather", 2), "all_gather_single_autograd": ("all_gather", 2),
    "all_reduce": ("all_reduce", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3), "reduce_scatter_single": ("reduce_scatter", 3),
    "reduce_scatter_tensor_autograd": ("reduce_scatter", 3), "reduce_scatter_single_autograd": ("reduce_scatter", 3),
    "permute_tensor": ("p2p", 2),
}
# torch.distributed's own: name -> (kind, index of the tensor, index of the group)
_PLAIN = {
    "all_gather": ("all_gather", 1, 2), "all_gather_into_tensor": ("all_gather", 1, 2),
    "all_reduce": ("all_reduce", 0, 2), "all_to_all_single": ("all_to_all", 1, 4),
    "reduce_scatter_tensor": ("reduce_scatter", 1, 3), "broadcast": ("broadcast", 0, 2),
    "send": ("p2p", 0, 2), "isend": ("p2p", 0, 2),
}


def _process_group(group) -> dist.ProcessGroup:
    """The ProcessGroup a collective's `group` argument names (None: the world; a (mesh, dim), a mesh, a name)."""
    if group is None:
        return dist.group.WORLD
    if isinstance(group, dist.ProcessGroup):
        return group
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(funcol._resolve_group_name(group))


def _nbytes(tensor) -> int:
    if isinstance(tensor, (list, tuple)):
        return sum(_nbytes(item) for item in tensor)
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def sent_bytes(kind: str, tensor, group, *, input_splits=None, source=None) -> int:
    """What this rank sends for one collective of `kind` on `tensor` over `group` (the table above)."""
    pg = _process_group(group)
    size, nbytes = pg.size(), _nbytes(tensor)
    if size <= 1:
        return 0
    if kind == "all_to_all":
        if input_splits:
            rows = sum(input_splits)
            return nbytes * (rows - input_splits[pg.rank()]) // max(rows, 1)
        return nbytes * (size - 1) // size
    if kind == "all_gather":
        return nbytes * (size - 1)
    if kind == "all_reduce":
        return 2 * (size - 1) * nbytes // size
    if kind == "reduce_scatter":
        return nbytes * (size - 1) // size
    if kind == "broadcast":
        return nbytes * (size - 1) if source is None or dist.get_rank() == source else 0
    return nbytes  # p2p


@dataclass(kw_only=True, slots=True)
class CollectiveBytes:
    """Counts the bytes this rank's collectives send, by kind, while installed and `counting`."""

    counting: bool = False
    """Count calls now (set around the part to measure)."""
    sent: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    _saved: list = field(default_factory=list)
    _depth: threading.local = field(default_factory=threading.local)

    def __enter__(self) -> "CollectiveBytes":
        from torch.distributed import _functional_collectives as funcol

        for name, (kind, group_index) in _FUNCTIONAL.items():
            self._wrap(funcol, name, kind, tensor_index=0, group_index=group_index,
                       splits_index=2 if kind == "all_to_all" else None)
        for name, (kind, tensor_index, group_index) in _PLAIN.items():
            self._wrap(dist, name, kind, tensor_index=tensor_index, group_index=group_index,
                       splits_index=3 if name == "all_to_all_single" else None)
        return self

    def __exit__(self, *exc) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()

    def total(self) -> int:
        return sum(self.sent.values())

    def _wrap(self, module, name: str, kind: str, *, tensor_index: int, group_index: int,
              splits_index: int | None) -> None:
        original = getattr(module, name, None)
        if original is None:
            return  # not in this torch
        counter = self

        def counted(*args, **kwargs):
            depth = getattr(counter._depth, "value", 0)
            if counter.counting and depth == 0:
                counter._count(kind, name, args, kwargs, tensor_index, group_index, splits_index)
            counter._depth.value = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._depth.value = depth

        counted.__wrapped__ = original
        self._saved.append((module, name, original))
        setattr(module, name, counted)

    def _count(self, kind, name, args, kwargs, tensor_index, group_index, splits_index) -> None:
        def argument(index, *keywords):
            if len(args) > index:
                return args[index]
            return next((kwargs[key] for key in keywords if kwargs.get(key) is not None), None)

        tensor = argument(tensor_index, "self", "tensor", "input")
        group = argument(group_index, "group")
        splits = argument(splits_index, "input_split_sizes") if splits_index is not None else None
        source = argument(1, "src") if kind == "broadcast" else None
        nbytes = sent_bytes(kind, tensor, group, input_splits=splits, source=source)
        self.sent[kind] = self.sent.get(kind, 0) + nbytes
        self.calls[name] = self.calls.get(name, 0) + 1
