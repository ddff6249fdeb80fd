"""Sequence parallelism for a block-causal transformer with a cached prefix (`genbatch.models.base.KeptPrefix`):
the output's tokens are split over the sequence group and the prefix stays whole on every rank.

    split hooks    before each block: the first block's hidden states [prefix P, output T] become
                   [prefix P, this rank's slice of T] (uneven, tensor_split-sized), and every block's per-token
                   inputs (rotary tables, modulation masks) the same; on a cached step the hidden states hold the
                   output alone (P = 0), the prefix's keys and values coming from each rank's cache
    attention      each block's processor runs unchanged. Its calls over the prefix alone (queries and keys inside
                   the prefix: the block-causal segments of the first step) are diffusers' own attention, on the
                   whole prefix every rank holds, as one process runs them; its call from the output's queries
                   attends over [prefix keys, every rank's output keys] (`attention.prefix.prefix_attention`)
    gather hook    after the last block: the output's slices are all-gathered behind the prefix

The prefix's compute at the first step is repeated on every rank (it is what fills each rank's cache); every
later step splits the whole forward. Each rank computes the same prefix from the same inputs, so the result
equals a one-process forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genbatch.models.base import KeptPrefix
from genbatch.parallel.attention import masks
from genbatch.parallel.attention.group import SequenceGroup
from genbatch.parallel.attention.layout import SequenceLayout
from genbatch.parallel.attention.prefix import prefix_attention


@dataclass(slots=True)
class PrefixState:
    """Per forward, set by the first block's hook: the prefix's length in the hidden states and the output's
    total, split over the group."""

    prefix: int = 0
    layout: SequenceLayout | None = None
    mask_checked: bool = False
    """Whether this forward's padding mask was found to spare the output's keys (checked once: a host sync)."""


class KeptPrefixSplit:
    """The split and gather hooks of one transformer; `handles` to remove them (`SequenceParallel.remove`)."""

    def __init__(self, model: torch.nn.Module, spec: KeptPrefix, group: SequenceGroup):
        self.spec, self.group, self.state = spec, group, PrefixState()
        blocks = list(model.get_submodule(spec.blocks))
        self.handles = [block.register_forward_pre_hook(self._before(index == 0), with_kwargs=True)
                        for index, block in enumerate(blocks)]
        self.handles.append(blocks[-1].register_forward_hook(self._after))

    def _cut(self, value: torch.Tensor, dim: int) -> torch.Tensor:
        """[prefix, output] along `dim` -> [prefix, this rank's slice of the output]."""
        prefix, layout = self.state.prefix, self.state.layout
        output = value.narrow(dim, prefix, value.shape[dim] - prefix)
        return torch.cat([value.narrow(dim, 0, prefix), layout.shard(output, self.group.rank, dim)], dim=dim)

    def _before(self, first: bool):
        def pre_hook(module, args, kwargs):
            if args:
                raise RuntimeError(f"{self.spec.blocks} blocks are called with positional inputs; sequence "
                                   "parallelism reads them by name: run this model with --ulysses 1 --ring 1")
            if first:
                hidden = kwargs["hidden_states"]
                self.state.prefix = self.spec.prefix_length(kwargs)
                self.state.mask_checked = False
                self.state.layout = SequenceLayout.split(hidden.shape[1] - self.state.prefix, self.group.size)
                kwargs["hidden_states"] = self._cut(hidden, 1).contiguous()
            for name in self.spec.token_inputs:
                if isinstance(kwargs.get(name), torch.Tensor):
                    kwargs[name] = self._cut(kwargs[name], 0)
            return args, kwargs

        return pre_hook

    def _after(self, module, args, hidden):
        prefix, layout = self.state.prefix, self.state.layout
        local = hidden[:, prefix:].transpose(0, 1).contiguous()  # (b, s_rank, c) -> (s_rank, b, c)
        pieces = self.group.sp.all_gather_uneven(local, layout.lengths, kind="sp_gather")
        output = torch.cat(pieces, dim=0).transpose(0, 1)  # p x (s_r, b, c) -> (T, b, c) -> (b, T, c)
        return torch.cat([hidden[:, :prefix], output], dim=1)  # (b, P + T, c)



class KeptPrefixRoute:
    """The attention of a kept-prefix model's routed modules (every block's): calls inside the prefix run as on
    one process, the output's call over [prefix, all output] runs `prefix_attention`."""

    def __init__(self, split: KeptPrefixSplit, name: str):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        self.split, self.name, self.used = split, name, False
        self._one_process = dispatch_attention_fn

    def attend(self, query, key, value, attn_mask, scale):
        self.used = True
        state, group = self.split.state, self.split.group
        local = state.layout.lengths[group.rank]
        if key.shape[1] <= state.prefix:  # queries and keys inside the prefix, which every rank holds whole
            return self._one_process(query, key, value, attn_mask=attn_mask, scale=scale)
        if query.shape[1] != local:
            raise RuntimeError(f"{self.name}: an attention call of {query.shape[1]} queries over {key.shape[1]} keys "
                               f"is neither inside the prefix ({state.prefix} tokens) nor the output's ({local} on "
                               "this rank); run this model with --ulysses 1 --ring 1")
        prefix = key.shape[1] - local  # the whole prefix's keys (this forward's, or the cache's), then this rank's
        prefix_mask = None
        if attn_mask is not None:  # (b, 1, 1, prefix + T): padded prompt keys; the output's keys are never padded
            mask = masks.key_padding(attn_mask, query.shape[0], self.name)
            spared = True
            if not torch.compiler.is_compiling() and not state.mask_checked:  # once a forward: a host sync
                spared, state.mask_checked = bool(mask[:, prefix:].all()), True
            if mask.shape[1] != prefix + state.layout.total or not spared:
                raise ValueError(f"{self.name}: sequence parallelism takes a padding mask over the prefix's keys "
                                 "only; run this model with --ulysses 1 --ring 1")
            prefix_mask = mask[:, :prefix]
        return prefix_attention(query, key[:, prefix:], value[:, prefix:], key[:, :prefix], value[:, :prefix], group,
                                state.layout, prefix_mask=prefix_mask, scale=scale)


__all__ = ["KeptPrefixRoute", "KeptPrefixSplit"]
