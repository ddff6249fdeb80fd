"""CFG parallel: the conditional and unconditional branches on the two halves of the cfg axis.

Each cfg rank runs one branch's transformer forward (with its own sequence-parallel group inside), then
the two predictions are exchanged once per step (one all-gather of the prediction, N x c values), and both
halves combine them identically. Jobs with a single branch (guidance <= 1, distilled models) run that
branch on both halves.
"""

from __future__ import annotations

from typing import Protocol

import torch

from genbatch.parallel.comm import Comm
from genbatch.parallel.context import ParallelContext


class BranchExchange(Protocol):
    """Decides which guidance branches this rank computes and completes the set after computing them."""

    def local_branches(self, names: list[str]) -> list[str]: ...

    def complete(self, predictions: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]: ...


class LocalBranches:
    """No CFG parallelism: this rank computes every branch."""

    def local_branches(self, names: list[str]) -> list[str]:
        return names

    def complete(self, predictions, names):
        return predictions


class CfgExchange:
    """CFG parallel: this rank computes the branch of its cfg rank; the predictions are exchanged once."""

    def __init__(self, comm: Comm):
        self.comm = comm

    def local_branches(self, names: list[str]) -> list[str]:
        if len(names) != self.comm.size:
            return names
        return [names[self.comm.rank]]

    def complete(self, predictions: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
        if len(names) != self.comm.size:
            return predictions
        (mine,) = predictions.values()
        mine = mine.contiguous()
        gathered = mine.new_empty((self.comm.size, *mine.shape))
        # (b, ...) on each cfg rank -> (cfg, b, ...) on every cfg rank, in branch order
        self.comm.all_gather_into(gathered.view(self.comm.size * mine.shape[0], *mine.shape[1:]), mine,
                                  kind="cfg_exchange")
        return {name: gathered[index] for index, name in enumerate(names)}


def branch_exchange(ctx: ParallelContext) -> BranchExchange:
    """The branch exchange for this rank's layout: local branches when cfg == 1."""
    return CfgExchange(ctx.cfg) if ctx.dims.cfg > 1 else LocalBranches()
