"""The collectives genbatch issues, each counting the bytes this rank sends.

Every collective of the parallel layer goes through a `Comm`: a process group plus a `CommLedger`. The
ledger adds up, per collective kind, the bytes this rank puts on the wire, under the usual algorithm
for that kind, so a test (and the timings table) can compare what was sent with seed 000's formulas:

| kind            | bytes this rank sends                                   |
|-----------------|---------------------------------------------------------|
| all_to_all      | its input minus the part it keeps                       |
| all_gather      | its input, once to each of the p-1 others               |
| all_reduce      | 2 (p-1)/p of the tensor (ring reduce-scatter + gather)  |
| reduce_scatter  | (p-1)/p of its input                                    |
| broadcast       | the tensor once to each other rank, on the source only  |
| p2p             | the tensor                                              |

The kind a call counts under may be named for what the bytes are for (`pp_latent`, `cfg_exchange`); the
algorithm's rule stays the one above. Objects (`broadcast_object`: a checkpoint, a scheduler's state) are the
control plane and are not counted. No module outside this one (and the mesh set-up) calls torch.distributed's
collectives or point-to-point operations itself.

Works the same on gloo (CPU tests) and NCCL (GPUs): only torch.distributed calls are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


KINDS = ("all_to_all", "p2p", "all_gather", "sp_gather", "sp_mask", "stale_kv", "pp_activation", "pp_text", "pp_latent", "cfg_exchange", "fsdp_all_gather", "broadcast",
         "all_reduce", "tp_all_reduce", "tp_all_gather", "tp_norm", "control")
"""The ledger's kinds, present from the start (a new one may still appear)."""


_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""Equal-size all-gather into one tensor: `all_gather_single` where torch has it (2.13 deprecates the older name,
with a FutureWarning a rank), else `all_gather_into_tensor`, the same call under its older name."""


def _counters() -> dict[str, torch.Tensor]:
    return {kind: torch.zeros((), dtype=torch.int64) for kind in KINDS}


@dataclass(slots=True)
class CommLedger:
    """Bytes sent by this rank, by collective kind, since the last `take()`.

    The counts are 0-d int64 tensors under fixed keys: a compiled region (`--compile`) that counts its
    all-to-alls adds to a tensor in its graph, where a Python int would be a value dynamo guards on (and a
    key added or dropped a change of the dict's length), each of which would recompile the region."""

    sent: dict[str, torch.Tensor] = field(default_factory=_counters)

    def add(self, kind: str, nbytes: int) -> None:
        if kind not in self.sent:
            self.sent[kind] = torch.zeros((), dtype=torch.int64)
        self.sent[kind] += nbytes

    def take(self) -> dict[str, int]:
        """Return the counts so far (kinds with bytes) and start again from zero (at each step boundary)."""
        counts = {kind: int(sent) for kind, sent in self.sent.items() if int(sent)}
        for sent in self.sent.values():
            sent.zero_()
        return counts

    def total(self) -> int:
        return sum(int(sent) for sent in self.sent.values())


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(slots=True)
class PendingGather:
    """An uneven all-gather in flight: `wait()` gives each rank's piece, (rows[r], ...), in group-rank order."""

    work: object | None
    """The collective's work handle (None: a group of one, nothing was sent)."""
    gathered: torch.Tensor
    """(p * longest, ...): every rank's padded piece."""
    rows: tuple[int, ...]
    """Each rank's real rows."""
    longest: int
    """The padded rows of each piece."""

    def wait(self) -> list[torch.Tensor]:
        if self.work is not None:
            self.work.wait()
            self.work = None
        # (p * longest, ...) -> p pieces of (rows[r], ...)
        return [self.gathered[r * self.longest : r * self.longest + rows] for r, rows in enumerate(self.rows)]

    @property
    def nbytes(self) -> int:
        """Bytes the gathered buffer holds."""
        return _nbytes(self.gathered)


@dataclass(slots=True)
class Comm:
    """A process group and the ledger its collectives count into."""

    group: dist.ProcessGroup | None
    ledger: CommLedger

    @property
    def size(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return 0 if self.group is None else dist.get_rank(self.group)

    def global_rank(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank)

    def all_to_all(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        async_op: bool = False,
    ):
        """`all_to_all_single` along dim 0; uneven splits allowed."""
        rows = tensor.shape[0]
        kept = input_split_sizes[self.rank] if input_split_sizes is not None else rows // self.size
        row_bytes = _nbytes(tensor) // max(rows, 1)
        self.ledger.add("all_to_all", (rows - kept) * row_bytes)
        return dist.all_to_all_single(
            output,
            tensor,
            output_split_sizes=list(output_split_sizes) if output_split_sizes is not None else None,
            input_split_sizes=list(input_split_sizes) if input_split_sizes is not None else None,
            group=self.group,
            async_op=async_op,
        )

    def all_gather_into(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False,
                        kind: str = "all_gather"):
        """Equal-size all-gather into one tensor whose dim 0 is `size` times the input's.

        `kind` names the ledger entry (e.g. "cfg_exchange"), so reports can tell what the bytes were for."""
        self.ledger.add(kind, _nbytes(tensor) * (self.size - 1))
        return _all_gather_single(output, tensor.contiguous(), group=self.group, async_op=async_op)

    def all_gather_uneven(self, tensor: torch.Tensor, rows: Sequence[int], kind: str = "all_gather") -> list[torch.Tensor]:
        """All-gather tensors whose dim 0 differs by rank (`rows[r]` on rank r): pad, gather, trim."""
        return self.start_all_gather_uneven(tensor, rows, kind).wait()

    def start_all_gather_uneven(self, tensor: torch.Tensor, rows: Sequence[int], kind: str = "all_gather"
                                ) -> PendingGather:
        """`all_gather_uneven` started asynchronously: its `wait()` gives the pieces (the work overlaps
        whatever runs before it)."""
        if self.group is None:  # a group of one: nothing to send
            return PendingGather(None, tensor, (tensor.shape[0],), tensor.shape[0])
        longest = max(rows)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        gathered = tensor.new_empty((longest * self.size, *tensor.shape[1:]))
        self.ledger.add(kind, _nbytes(tensor) * (self.size - 1))
        work = _all_gather_single(gathered, padded, group=self.group, async_op=True)
        return PendingGather(work, gathered, tuple(rows), longest)

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM, kind: str = "all_reduce") -> torch.Tensor:
        self.ledger.add(kind, 2 * (self.size - 1) * _nbytes(tensor) // self.size)
        dist.all_reduce(tensor, op=op, group=self.group)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src_group_rank: int = 0, kind: str = "broadcast") -> torch.Tensor:
        """`tensor` from group rank `src_group_rank` to every rank, in place."""
        if self.rank == src_group_rank:
            self.ledger.add(kind, _nbytes(tensor) * (self.size - 1))
        dist.broadcast(tensor, src=self.global_rank(src_group_rank), group=self.group)
        return tensor

    def broadcast_object(self, value: object, src_group_rank: int = 0) -> object:
        """A picklable object from group rank `src_group_rank` (what every other rank passes is ignored);
        not counted (the control plane)."""
        holder = [value]
        dist.broadcast_object_list(holder, src=self.global_rank(src_group_rank), group=self.group)
        return holder[0]

    def all_gather_object(self, value: object) -> list[object]:
        """Every rank's picklable `value`, in group-rank order (a group of one: `[value]`); not counted (the
        control plane)."""
        if self.group is None or self.size == 1:
            return [value]
        gathered: list[object] = [None] * self.size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def send(self, tensor: torch.Tensor, to_group_rank: int, kind: str = "p2p"):
        """Start sending `tensor` to group rank `to_group_rank`; returns the work to wait on (keep `tensor`
        alive until then)."""
        self.ledger.add(kind, _nbytes(tensor))
        return dist.isend(tensor, dst=self.global_rank(to_group_rank), group=self.group)

    def recv(self, tensor: torch.Tensor, from_group_rank: int) -> torch.Tensor:
        """Receive into `tensor` from group rank `from_group_rank` (blocking)."""
        dist.recv(tensor, src=self.global_rank(from_group_rank), group=self.group)
        return tensor

    def exchange(self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]):
        """Start point-to-point sends and receives (peers as group ranks); returns the works to wait on."""
        ops = []
        for tensor, peer in sends:
            self.ledger.add("p2p", _nbytes(tensor))
            ops.append(dist.P2POp(dist.isend, tensor, self.global_rank(peer), self.group))
        for tensor, peer in recvs:
            ops.append(dist.P2POp(dist.irecv, tensor, self.global_rank(peer), self.group))
        return dist.batch_isend_irecv(ops) if ops else []
