"""What an error says: its one-line description (with the fix for running out of memory), and whether it came
from a collective (a peer lost, hung or hung up) rather than from the work itself."""

from __future__ import annotations

_OUT_OF_MEMORY_FIX = ("; the job does not fit in this group's memory: shard the weights with --fsdp, split the job "
                      "over more ranks (--ulysses / --ring; `gen plan --gpu-mem` says which fit), or make it smaller "
                      "(size, frames, --dtype bf16, a smaller --batch-size or --batch-size auto)")


def describe_error(error: BaseException) -> str:
    """`Type: first line of the message`, plus what to change when it is an out-of-memory error."""
    text = str(error).strip().splitlines()
    described = f"{type(error).__name__}: {text[0] if text else ''}".strip()
    return described + _OUT_OF_MEMORY_FIX if out_of_memory(error) else described


def out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.OutOfMemoryError)


def is_collective_error(error: BaseException) -> bool:
    """Whether `error` came from a collective or the coordination store (a peer died, hung or hung up)."""
    import torch.distributed as dist

    if isinstance(error, (dist.DistError, TimeoutError)):
        return True
    text = str(error)
    return any(hint in text for hint in ("Connection closed by peer", "Timed out", "gloo", "NCCL", "Connection reset"))
