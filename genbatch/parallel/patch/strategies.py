"""The patch-parallel attention strategy over stale K/V, registered beside `exact` as `distrifusion`.

Each rank holds one patch of every split stream (the sequence splits' split points, over the distrifusion
axis) and computes q, k, v for it. With a job's `StaleState` set (`StaleSession`), by the state's method:

    synchronous forward    all-gather this call's K/V, attend to all of it (exact), keep it
    distrifusion           attend to the kept K/V of the step before with this rank's own slot fresh, and
                           start the all-gather of the fresh K/V, which the same call of the next step waits
                           for: the gather overlaps a whole step of compute
    naive_patch            attend to this patch's own keys only (no K/V exchange): the baseline
                           DistriFusion's error is measured against

Without a state (a forward outside a job) every call is exact. The K/V travel as one (s_rank, 2, b, h, d)
tensor per call, counted as `stale_kv` in the ledger. The calls hold Python state, so under `--compile` each
call is one opaque node (`genbatch.parallel.attention.stateful`) and the block compiles whole around it.
"""

from __future__ import annotations


from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.local import local_attention
from genbatch.parallel.attention.stateful import StatefulAttention, attend_through_op, pack_kv, unpack_kv
from genbatch.parallel.attention.strategy import register_strategy
from genbatch.parallel.stale import DISTRIFUSION, NAIVE_PATCH
from genbatch.parallel.patch.state import StaleState


@register_strategy(DISTRIFUSION)
class StalePatchAttention(StatefulAttention):
    name = DISTRIFUSION

    def __init__(self, group: SequenceGroup):
        super().__init__(group)
        self.state: StaleState | None = None

    def _attend(self, q, k, v, key_mask, scale):
        return local_attention(q, k, v, scale=scale, backend=self.group.kernel, key_mask=key_mask)[0]

    def attend(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
        """This rank's patch q, k, v (b, s_rank, h, d) -> its patch of the output (b, s_rank, h, d); one opaque
        node under compile (`genbatch.parallel.attention.stateful`)."""
        return attend_through_op(self.handle, q, k, v, site=site, layout=layout, key_mask=key_mask, scale=scale)

    def attend_now(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
        """`attend`, eagerly, with the job's state."""
        comm, state = self.group.sp, self.state
        lengths = list(layout.lengths)
        key, sync = state.call() if state is not None else (None, True)
        if sync:
            gather = comm.start_all_gather_uneven(pack_kv(k, v), lengths, kind="stale_kv")
            if state is not None:
                state.keep(key, gather)
            keys, values = unpack_kv(gather.wait())
            return self._attend(q, keys, values, key_mask, scale)
        if state.method == NAIVE_PATCH:
            if key_mask is not None:  # (b, S) in patch-rank order -> this rank's keys
                start = layout.offsets[comm.rank]
                key_mask = key_mask[:, start : start + lengths[comm.rank]]
            return self._attend(q, k, v, key_mask, scale)
        pieces = state.buffers[key].wait()  # the step before's K/V of every patch
        fresh = pack_kv(k, v)
        pieces[comm.rank] = fresh
        state.keep(key, comm.start_all_gather_uneven(fresh, lengths, kind="stale_kv"))
        keys, values = unpack_kv(pieces)
        return self._attend(q, keys, values, key_mask, scale)
