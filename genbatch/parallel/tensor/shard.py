"""A transformer's tensor splits resolved on the module and applied, in place, over the tp group.

    styles = resolved_styles(model, family_splits)   # module name -> style: diffusers' _tp_plan + the family's
    tensor_parallel(model, family_splits, comm, mesh)

The styles (`genbatch.models.base.TENSOR_STYLES`) are applied to every module whose name matches a pattern
part by part (`blocks.*.attn1.to_q` matches `blocks.3.attn1.to_q`); a pattern a variant of the class lacks
(SD3.5's `attn2` on SD3, the last SD3 block's text projections) is skipped. Before anything is split every
split is checked to divide by tp, so a layout that cannot work fails whole, naming the module and the fix.
"""

from __future__ import annotations

import torch

from genbatch.models.base import HEAD_CHANNELS, HEADS, NORM_ACROSS_HEADS, PACKED_ROWWISE, TensorSplits
from genbatch.parallel.comm import Comm
from genbatch.parallel.compile import _matches
from genbatch.parallel.tensor.norm import HeadShardedRMSNorm
from genbatch.parallel.tensor.styles import apply_style, split_sizes


def _diffusers_styles(model: torch.nn.Module) -> dict[str, str]:
    """The class's diffusers `_tp_plan` in the plan's words."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel, PackedRowwiseParallel

    styles = {}
    for pattern, style in (getattr(model, "_tp_plan", None) or {}).items():
        if isinstance(style, PackedRowwiseParallel):
            style = PACKED_ROWWISE
        elif isinstance(style, PackedColwiseParallel):
            raise ValueError(f"{type(model).__name__}'s _tp_plan packs {pattern!r} column-wise, which genbatch "
                             "does not split; list the model's own styles in its family's TensorSplits")
        styles[pattern] = style
    return styles


def resolved_styles(model: torch.nn.Module, splits: TensorSplits) -> dict[str, str]:
    """Module name -> style for this model: diffusers' `_tp_plan` (when the plan starts from it), then the
    family's styles, each pattern expanded over the model's modules."""
    patterns = {**(_diffusers_styles(model) if splits.from_diffusers else {}), **splits.styles}
    if not patterns:
        raise ValueError(f"{type(model).__name__} has empty tensor splits; fill its family's TensorSplits")
    found = {}
    for name, _ in model.named_modules():
        for pattern, style in patterns.items():
            if _matches(name, pattern):
                found[name] = style
    return found


def _check_divides(model: torch.nn.Module, styles: dict[str, str], size: int, flag: str) -> None:
    problems = []
    for name, style in styles.items():
        module = model.get_submodule(name)
        if style == HEADS:
            problems += [f"{name} has {value} {attribute}" for attribute in HEAD_WIDTHS
                         if isinstance(value := getattr(module, attribute, None), int) and value % size]
        elif style == NORM_ACROSS_HEADS:
            if module.normalized_shape[0] % size:
                problems.append(f"{name} normalises {module.normalized_shape[0]} channels")
        elif style == HEAD_CHANNELS:
            heads = getattr(module, "num_attention_heads", None)
            if isinstance(heads, int) and heads % size:
                problems.append(f"{name} spans {heads} heads")
        else:
            for param, shard in split_sizes(style, module).items():
                if shard is not None and any(block % size for block in shard[1]):
                    problems.append(f"{name}.{param} splits {shard[1]} along dim {shard[0]}")
    if problems:
        raise ValueError(f"{flag} does not divide {type(model).__name__}: {'; '.join(problems)}; choose a "
                         "degree that divides the head count and the MLP width")


def tensor_parallel(model: torch.nn.Module, splits: TensorSplits, comm: Comm, mesh, flag: str | None = None
                    ) -> dict[str, str]:
    """Split `model` over the group `comm` (its 1-D DeviceMesh `mesh`: the tp axis, or the job group for a
    text encoder) by `splits`; return the styles applied by module name. Heads divide last, after their
    projections are split. `flag`: how errors name the split (default `--tp N`)."""
    styles = resolved_styles(model, splits)
    _check_divides(model, styles, comm.size, flag or f"--tp {comm.size}")
    for name, style in styles.items():
        if style == HEAD_CHANNELS:
            _keep_head_channels(model.get_submodule(name), comm)
        elif style not in (HEADS, NORM_ACROSS_HEADS):
            apply_style(model.get_submodule(name), style, mesh, comm)
    for name, style in styles.items():
        if style == NORM_ACROSS_HEADS:
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner), attribute, HeadShardedRMSNorm(model.get_submodule(name), comm, mesh))
        elif style == HEADS:
            _divide_heads(model.get_submodule(name), comm.size)
    return styles


HEAD_WIDTHS = ("heads", "inner_dim", "kv_inner_dim", "n_heads", "num_heads", "num_key_value_heads")
"""The attention module's attributes its forward reshapes by (Wan's processor unflattens by `heads`,
Qwen-Image's derives the head size as `inner_dim // heads`, T5's views by `n_heads`): each rank's module
counts only its own heads (a grouped-query module its own key/value heads too, their ratio unchanged)."""


def _keep_head_channels(module: torch.nn.Module, comm: Comm) -> None:
    """A forward hook that keeps this rank's heads' share of each output tensor: the last dim of a 3-dim one
    (b, s, heads x d), the head dim of a 4-dim one (b, heads, s, d)."""

    def keep(tensor):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        dim = 1 if tensor.ndim == 4 else -1
        width = tensor.shape[dim] // comm.size
        return tensor.narrow(dim, comm.rank * width, width)  # (..., c, ...) -> (..., c/p, ...) along `dim`

    def hook(mod, args, output):
        return type(output)(keep(item) for item in output) if isinstance(output, (tuple, list)) else keep(output)

    module.register_forward_hook(hook)


def _divide_heads(attention: torch.nn.Module, size: int) -> None:
    for attribute in HEAD_WIDTHS:
        value = getattr(attention, attribute, None)
        if isinstance(value, int):
            setattr(attention, attribute, value // size)

