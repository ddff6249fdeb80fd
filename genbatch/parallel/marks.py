"""What genbatch records about a module it parallelised, kept beside the module rather than set on it.

    SEQUENCE_PARALLEL = ModuleMark("sequence parallel")   one registry per kind of record
    SEQUENCE_PARALLEL.put(model, sequence)                 recorded when the method is applied
    SEQUENCE_PARALLEL.get(model)                           None when the model carries none
    SEQUENCE_PARALLEL.pop(model)                           forgotten when the method is removed

The records are held by weak reference to the module, so a dropped pipeline drops them too, and upstream
modules keep only their own attributes (no `_genbatch_*` attribute that `state_dict`, `repr`, FSDP2's class swap
or a later `copy` would have to know about).
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

import torch

Record = TypeVar("Record")


class ModuleMark(Generic[Record]):
    """One kind of record, by module."""

    def __init__(self, name: str):
        self.name = name
        self._records: weakref.WeakKeyDictionary[torch.nn.Module, Record] = weakref.WeakKeyDictionary()

    def put(self, module: torch.nn.Module, record: Record) -> None:
        self._records[module] = record

    def get(self, module: torch.nn.Module | None, default: Record | None = None) -> Record | None:
        if module is None:
            return default
        return self._records.get(module, default)

    def pop(self, module: torch.nn.Module, default: Record | None = None) -> Record | None:
        return self._records.pop(module, default)

    def __repr__(self) -> str:
        return f"ModuleMark({self.name!r}, {len(self._records)} modules)"
