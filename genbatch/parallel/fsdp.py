"""FSDP2 weight sharding for inference: per block, then the root, over the job group.

Each rank keeps 1/p of every sharded module's weights; a module's forward all-gathers its weights and
frees them after (`reshard_after_forward=True`), so per-rank parameter memory is about 1/p plus one block.
Loading never materialises the full model on every rank: ranks build the module on the meta device, shard
it, allocate only their shards, and the group leader, which alone reads the full weights (on the CPU),
sends each tensor to the group, every rank keeping its own slice.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from genbatch.models.registry import all_repeated_blocks, module_blocks
from genbatch.parallel.comm import Comm, CommLedger
from genbatch.parallel.tensor.loading import tp_part


def block_paths(module: torch.nn.Module) -> tuple[str, ...]:
    """Where `module`'s repeated blocks live (the FSDP units below the root): its family's `Blocks.repeated`
    for a transformer or text encoder class a family lists, else every path any family lists."""
    blocks = module_blocks(type(module).__name__)
    return blocks.repeated if blocks is not None else all_repeated_blocks()


def _block_lists(module: torch.nn.Module) -> list[torch.nn.ModuleList]:
    found = []
    for path in block_paths(module):
        current = module
        for part in path.split("."):
            current = getattr(current, part, None)
            if current is None:
                break
        if isinstance(current, torch.nn.ModuleList):
            found.append(current)
    return found


def _local(param: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a parameter: a DTensor's local part (a tp split, an FSDP shard)."""
    return param.to_local() if isinstance(param, DTensor) else param


def _local_bytes(params) -> int:
    return sum(_local(param).numel() * _local(param).element_size() for param in params)


def _unsharded(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters of `module` that no FSDP unit manages yet (a tensor-parallel DTensor still counts: FSDP
    shards its local part over the non-tp sub-mesh, torchtitan's 2-D layout)."""
    managed = {id(param) for sub in module.modules() if isinstance(sub, FSDPModule) for param in sub.parameters()}
    return [param for param in module.parameters() if id(param) not in managed]


def _shard_unit(module: torch.nn.Module, mesh, ledger: CommLedger) -> None:
    """fully_shard `module` (its not-yet-sharded parameters) and count its all-gather per forward: this
    rank's padded shard (dim 0 of its local part split in ceil(n/p) rows) once to each of the p-1 others."""
    p = mesh.size()
    nbytes = 0
    for param in map(_local, _unsharded(module)):
        rows = -(-param.shape[0] // p) if param.dim() else 1
        nbytes += rows * (param.numel() // max(param.shape[0], 1) if param.dim() else 1) * param.element_size()
    unsharded_class = type(module)
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    _keep_output_recording(module, unsharded_class)
    module.register_forward_pre_hook(lambda mod, args: ledger.add("fsdp_all_gather", nbytes * (p - 1)))


def _keep_output_recording(module: torch.nn.Module, unsharded_class: type) -> None:
    """transformers finds which outputs a model records (`output_hidden_states`) by the model's class name;
    `fully_shard` swaps the class for an FSDP subclass, so the subclass gets the same entry (without it, a
    sharded Llama text encoder returns no hidden states)."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without output recording: nothing to keep
        return
    recorded = dict.get(_CAN_RECORD_REGISTRY, str(unsharded_class))
    if recorded is not None:
        _CAN_RECORD_REGISTRY[module] = recorded


def _shard_uniform(module: torch.nn.Module, mesh, ledger: CommLedger) -> None:
    """Shard `module` as one unit when its unsharded parameters share one dtype (FSDP2 needs that);
    otherwise shard its children first (models keep some modules in fp32 under bf16 weights), and then
    what remains if it is uniform (mixed parameters held directly by one module stay replicated)."""
    if len({param.dtype for param in _unsharded(module)}) > 1:
        for child in module.children():
            _shard_uniform(child, mesh, ledger)
    remaining = _unsharded(module)
    if remaining and len({param.dtype for param in remaining}) == 1:
        _shard_unit(module, mesh, ledger)


def shard(module: torch.nn.Module, mesh, ledger: CommLedger) -> None:
    """fully_shard every block, then the root, over `mesh` (1-D: the job group); count the all-gathers
    (seed 000: FSDP inference, one all-gather of the weights per forward)."""
    for blocks in _block_lists(module):
        for block in blocks:
            _shard_uniform(block, mesh, ledger)
    _shard_uniform(module, mesh, ledger)


def fsdp_part(tensor: torch.Tensor, mesh) -> torch.Tensor:
    """This rank's FSDP shard of `tensor`: its chunk of dim 0 (torch.chunk's sizes; empty past the last)."""
    chunks = torch.chunk(tensor, mesh.size(), dim=0) if tensor.dim() else (tensor,)
    rank = mesh.get_local_rank() if tensor.dim() else 0
    return chunks[rank] if rank < len(chunks) else tensor[:0]


@torch.no_grad()
def load_shards(module: torch.nn.Module, full_state: dict | None, group: Comm, mesh, device: torch.device,
                tp: Comm | None = None, staged: bool = False) -> None:
    """Fill a sharded, meta-built module: the leader (full_state given) sends every tensor, each rank keeps
    its slice. Buffers (persistent or not) and plain tensors are sent whole: every rank needs all of them.

    When the FSDP mesh is the whole group, each parameter goes out over it (`distribute_tensor`). Under tensor
    parallelism (`tp` of more than one rank) or PipeFusion (`staged`, pp > 1), the FSDP meshes of the other
    tp ranks or stages do not hold the leader, so `_load_by_listing` sends each tensor to the whole group."""
    module.to_empty(device=device)
    if staged or (tp is not None and tp.size > 1):
        return _load_by_listing(module, full_state, group, mesh, device, tp)
    leader = group.rank == 0
    for name, param in module.named_parameters():
        source = (full_state[name].to(device=device, dtype=param.dtype) if leader
                  else torch.empty(param.shape, dtype=param.dtype, device=device))
        # distribute_tensor sends mesh rank 0's tensor; each rank keeps its Shard(0) slice
        group.ledger.add("broadcast", source.numel() * source.element_size() * (group.size - 1) if leader else 0)
        sharded = distribute_tensor(source, mesh, [Shard(0)])
        param.to_local().copy_(sharded.to_local())
    for name, buffer in module.named_buffers():
        if leader:
            buffer.copy_(full_state[name].to(device=device, dtype=buffer.dtype))
        group.broadcast(buffer, src_group_rank=0)
    for owner, attribute, meta_tensor in _plain_tensors(module):
        value = torch.empty_like(meta_tensor, device=device)
        if leader:
            value.copy_(full_state[f"{owner}.{attribute}" if owner else attribute])
        group.broadcast(_sendable(value), src_group_rank=0)
        setattr(module.get_submodule(owner), attribute, value)


def _load_by_listing(module: torch.nn.Module, full_state: dict | None, group: Comm, mesh, device: torch.device,
                     tp: Comm | None) -> None:
    """`load_shards` when the ranks' FSDP meshes do not all hold the leader: ranks of other tp parts, or
    PipeFusion stages that each hold their own blocks (a cut model, or a component every stage holds whole).
    The leader says which tensors the whole model has (name, shape, dtype), then broadcasts each to the whole
    group; every rank keeps what its module holds under that name (`pipeline.stages.stage_name`, the name
    itself for a model that is not cut): its FSDP shard (of its tp part) of a parameter, a buffer or plain
    tensor whole."""
    from genbatch.parallel.pipeline.stages import stage_name

    listing = group.broadcast_object([(name, tuple(value.shape), value.dtype) for name, value in full_state.items()]
                                     if group.rank == 0 else None)
    params, buffers = dict(module.named_parameters()), dict(module.named_buffers())
    plain = {f"{owner}.{attribute}" if owner else attribute: (owner, attribute)
             for owner, attribute, _ in _plain_tensors(module)}
    split = tp is not None and tp.size > 1
    for name, shape, dtype in listing:
        value = (full_state[name].to(device=device) if group.rank == 0
                 else torch.empty(shape, dtype=dtype, device=device))
        group.broadcast(_sendable(value), src_group_rank=0)
        local = stage_name(module, name)
        if local in params:
            part = tp_part(module, local, value, tp.rank, tp.size) if split else value
            params[local].to_local().copy_(fsdp_part(part, mesh))
        elif local in buffers:
            buffers[local].copy_(value)
        elif local in plain:
            owner, attribute = plain[local]
            setattr(module.get_submodule(owner), attribute, value.clone())


def _sendable(value: torch.Tensor) -> torch.Tensor:
    """gloo sends no complex tensors: (...,) complex -> (..., 2) real view of the same memory."""
    return torch.view_as_real(value) if value.is_complex() else value


def _plain_tensors(module: torch.nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(module name, attribute, tensor) of tensors a module keeps as plain attributes, neither parameter
    nor buffer (e.g. Qwen-Image's complex rotary tables): `to_empty` leaves them on the meta device."""
    return [
        (owner, attribute, value)
        for owner, sub in module.named_modules()
        for attribute, value in vars(sub).items()
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.is_meta
    ]


def full_state(module: torch.nn.Module) -> dict:
    """Parameters, every buffer (non-persistent ones too) and plain tensor attributes of a fully
    materialised module, by name."""
    state = {name: param.detach() for name, param in module.named_parameters()}
    state.update({name: buffer.detach() for name, buffer in module.named_buffers()})
    state.update(
        {
            f"{owner}.{attribute}" if owner else attribute: value
            for owner, sub in module.named_modules()
            for attribute, value in vars(sub).items()
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
        }
    )
    return state


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds (its shards under FSDP)."""
    return _local_bytes(module.parameters())
