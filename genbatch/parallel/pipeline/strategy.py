"""The PipeFusion attention strategy, registered beside `exact` as `pipefusion`.

Each call runs as Ulysses does over the stage's sequence ranks (heads scattered, this forward's whole sequence
gathered; one rank: as it is). On the gathered q, k, v (b, S_forward, h/U, d), with a job's `PipeState` set:

    synchronous step     the fresh K/V go into the call's buffer and the call attends to them (exact)
    patch forward        the patch's fresh K/V (and the text's) go into the buffer, and the patch's queries
                         attend to the whole buffer: the earlier patches' K/V of this step, the later ones' of
                         the step before
    naive patches        the patch's queries attend to this forward's keys only (the baseline)

Key-padding masks are refused (no PipeFusion model masks its self-attention). Without a state every call is exact.
The calls keep Python state, so each is one opaque node under `--compile` (`attention.stateful`): the blocks of
a stage compile whole, with no graph break.
"""

from __future__ import annotations


from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.local import local_attention
from genbatch.parallel.attention.stateful import attend_through_op, hold
from genbatch.parallel.attention.strategy import register_strategy
from genbatch.parallel.attention.ulysses import ulysses_wrap
from genbatch.parallel.pipeline.state import PipeState

PIPEFUSION = "pipefusion"


@register_strategy(PIPEFUSION)
class PipeFusionAttention:
    name = PIPEFUSION
    takes_streams = True

    def __init__(self, group: SequenceGroup):
        if group.ring.size > 1:
            raise ValueError("--pipefusion with --ring: the stale K/V buffers follow Ulysses' layout only; use "
                             "--ulysses for the sequence-parallel ranks of a stage")
        self.group = group
        self.state: PipeState | None = None
        self.handle = hold(self)

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
        state, ulysses = self.state, self.group.ulysses
        if state is None or state.naive:
            return ulysses_wrap(q, k, v, ulysses, layout.lengths, lambda qh, kh, vh: self._local(qh, kh, vh, scale))
        key = state.next_call()
        positions, length = state.positions(state.counted(streams, site), ulysses.size, q.device)

        def attend_buffer(qh, kh, vh):
            buffers = state.buffers.get(key)
            if buffers is None:
                # (b, S_forward, h/U, d) -> (b, S, h/U, d): every token's K and V, kept across steps
                shape = (kh.shape[0], length, *kh.shape[2:])
                buffers = state.buffers[key] = (kh.new_zeros(shape), vh.new_zeros(shape))
            keys, values = buffers
            keys.index_copy_(1, positions, kh)
            values.index_copy_(1, positions, vh)
            if state.patch is None:
                return self._local(qh, kh, vh, scale)
            return self._local(qh, keys, values, scale)

        return ulysses_wrap(q, k, v, ulysses, layout.lengths, attend_buffer)
