"""StaleState: one denoiser's stale K/V of one job on one rank, and when a forward must be synchronous.

Every attention call of a forward (in the order the model makes them, the same on every rank) has one buffer
per guidance branch: the K/V of every patch as last gathered, (S, 2, b, h, d) in patch-rank order (rank 0's
tokens, then rank 1's, ...), possibly still in flight. A forward is synchronous (its K/V gathered and used at
once: exact) during the first `warmup_steps` steps this denoiser runs in the job, in every step of
`extra_sync`, and whenever its branch has no buffer yet; otherwise it attends to the buffers of the step before.

The first steps are counted from the first forward of this job's state, so a resumed job (a new state) and a
switch to Wan 2.2's second expert (another denoiser's state) re-warm for `warmup_steps` steps as a new job does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genbatch.parallel.comm import PendingGather


@dataclass(kw_only=True, slots=True)
class StaleState:
    method: str
    """`DISTRIFUSION` (attend to the step before's K/V) or `NAIVE_PATCH` (to this patch's own only)."""
    warmup_steps: int
    """Synchronous steps from the first step this state runs."""
    extra_sync: frozenset[int] = frozenset()
    """Further step indices that run synchronously (a reference for a resumed run: its re-warm steps)."""
    buffers: dict[tuple[str, int], PendingGather] = field(default_factory=dict)
    """(branch, attention call index) -> that call's K/V of every patch, gathered (or in flight)."""
    first_step: int | None = None
    """The step of this state's first forward."""
    branch: str = ""
    """The branch of the forward running now."""
    step: int = 0
    """The step of the forward running now."""
    sync: bool = True
    """Whether the forward running now gathers its K/V and uses them at once."""
    calls: int = 0
    """Attention calls made so far by the forward running now."""
    peak_bytes: int = 0
    """The most bytes the buffers held at once, measured after each call."""
    _branches: set[str] = field(default_factory=set)
    _decided: bool = False

    def arm(self, branch: str, step: int) -> None:
        """A forward of `branch` at step `step` may run next (whether this denoiser runs it shows at its first
        attention call: Wan 2.2 runs one of its two experts a step)."""
        self.branch, self.step, self.calls, self._decided = branch, step, 0, False

    def call(self) -> tuple[tuple[str, int], bool]:
        """(the buffer key, synchronous?) of the attention call being made; the first call of a forward decides
        for the whole forward."""
        if not self._decided:
            if self.first_step is None:
                self.first_step = self.step
            warming = self.step < self.first_step + self.warmup_steps
            self.sync = warming or self.step in self.extra_sync or self.branch not in self._branches
            self._branches.add(self.branch)
            self._decided = True
        key = (self.branch, self.calls)
        self.calls += 1
        return key, self.sync

    def keep(self, key: tuple[str, int], gather: PendingGather) -> None:
        """`gather` is `key`'s buffer from now on (the previous one is dropped)."""
        self.buffers[key] = gather
        self.peak_bytes = max(self.peak_bytes, self.held_bytes())

    def held_bytes(self) -> int:
        """Bytes the buffers hold now."""
        return sum(gather.nbytes for gather in self.buffers.values())

    def clear(self) -> None:
        """Drop every buffer (waiting for those in flight, so no collective is left behind)."""
        for gather in self.buffers.values():
            gather.wait()
        self.buffers.clear()
