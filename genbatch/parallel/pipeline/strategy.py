"""The PipeFusion attention strategy, registered beside `exact` as `pipefusion`.

Each call runs as USP does over the stage's ring x ulysses sequence ranks (heads scattered over the Ulysses row,
the row's tokens of this forward gathered; one rank: as it is). On the gathered q, k, v (b, S_row, h/U, d), with a
job's `PipeState` set:

    synchronous step     the fresh K/V (over the ring too, gathered once) go into the call's buffer, each ring
                         rank keeping its part, and the call attends to them (exact)
    patch forward        the patch's fresh K/V (and the text's) go into the buffer, and the patch's queries
                         attend to the whole buffer, passed around the ring: the earlier patches' K/V of this
                         step, the later ones' of the step before
    naive patches        the patch's queries attend to this forward's keys only (the baseline)

With Ulysses alone the buffer is the whole sequence's K/V for h/U heads; under Ring each ring rank keeps 1/R of
the tokens (`PipeState.slots`), so stale K/V memory is 2 N d L/P / (U R) a rank and branch.

Key-padding masks are refused (no PipeFusion model masks its self-attention). Without a state every call is exact.
The calls keep Python state, so each is one opaque node under `--compile` (`attention.stateful`): the blocks of
a stage compile whole, with no graph break.
"""

from __future__ import annotations

from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.local import local_attention
from genbatch.parallel.attention.ring import ring_pass
from genbatch.parallel.attention.stateful import StatefulAttention, attend_through_op, pack_kv, unpack_kv
from genbatch.parallel.attention.strategy import register_strategy
from genbatch.parallel.attention.ulysses import ulysses_wrap
from genbatch.parallel.attention.usp import usp_attention
from genbatch.parallel.pipeline.state import PipeState

PIPEFUSION = "pipefusion"


@register_strategy(PIPEFUSION)
class PipeFusionAttention(StatefulAttention):
    name = PIPEFUSION

    def __init__(self, group: SequenceGroup):
        super().__init__(group)
        self.state: PipeState | None = None

    def _local(self, q, k, v, scale):
        return local_attention(q, k, v, scale=scale, backend=self.group.kernel)[0]

    def attend(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
        """This rank's q, k, v (b, s_rank, h, d) of the forward's tokens -> its part of the output; one opaque
        node under compile (`genbatch.parallel.attention.stateful`)."""
        if key_mask is not None:
            raise ValueError(f"{site}: --pipefusion takes no key-padding mask; run this model with --pipefusion 1")
        return attend_through_op(self.handle, q, k, v, site=site, layout=layout, key_mask=None, scale=scale,
                                 streams=streams)

    def attend_now(self, q, k, v, *, site, layout, key_mask, scale, streams=()):
        """`attend`, eagerly, with the job's state."""
        state, ulysses, ring, kernel = self.state, self.group.ulysses, self.group.ring, self.group.kernel
        if state is None or state.naive:  # exact over this forward's keys (a patch forward's: the baseline)
            return usp_attention(q, k, v, ulysses, ring, layout, scale=scale, backend=kernel)
        key = state.next_call()
        slots = state.slots(state.counted(streams, site), ulysses.size, ring.size, ring.rank, q.device)
        row = layout.row(ring.rank, ulysses.size)  # this ring row's Ulysses shards

        def attend_buffer(qh, kh, vh):
            buffers = state.buffers.get(key)
            if buffers is None:
                # (b, S_forward_row, h/U, d) -> (b, S_kept, h/U, d): the kept tokens' K and V, across steps
                shape = (kh.shape[0], slots.lengths[ring.rank], *kh.shape[2:])
                buffers = state.buffers[key] = (kh.new_zeros(shape), vh.new_zeros(shape))
            keys, values = buffers
            if state.patch is None:  # a whole forward: every key fresh, attended at once (exact)
                if ring.size > 1:
                    pieces = ring.all_gather_uneven(pack_kv(kh, vh), layout.rows(ulysses.size).lengths,
                                                    kind="stale_kv")
                    kh, vh = unpack_kv(pieces)
                    keys.index_copy_(1, slots.kept_slots, kh.index_select(1, slots.kept))
                    values.index_copy_(1, slots.kept_slots, vh.index_select(1, slots.kept))
                else:
                    keys.index_copy_(1, slots.fresh, kh)
                    values.index_copy_(1, slots.fresh, vh)
                return self._local(qh, kh, vh, scale)
            keys.index_copy_(1, slots.fresh, kh)
            values.index_copy_(1, slots.fresh, vh)
            # the patch's queries against every ring rank's buffer (one rank: its own, the whole sequence)
            return ring_pass(qh, keys, values, ring, slots.lengths, scale, None, kernel)

        return ulysses_wrap(q, k, v, ulysses, row.lengths, attend_buffer)
