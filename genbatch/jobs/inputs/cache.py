"""The `cache` input: a row's step-caching mode (`genbatch.jobs.cache`), else the run's `--cache`, else `none`."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.cache import cache_problem, canonical_cache
from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput

ORDER = 30
"""Where its problems stand among a row's."""


def problem(value: str | None) -> str | None:
    """Why a row's own `cache` value cannot run (None: null, or a valid mode)."""
    if value is None:
        return None
    found = cache_problem(value)
    return found and f"{found}; or leave it null for the run's --cache"


def job_cache(value: str | None, run_cache: str | None) -> str:
    """The canonical mode of a valid row: its own `cache`, else the run's `--cache`, else `none`."""
    return canonical_cache(value if value is not None else run_cache)


def _check(batch: InputBatch) -> Checked:
    """The resolved `cache` column (canonical modes, the run's `--cache` for nulls); each distinct value is
    checked once, and every row of a bad one gets its problem."""
    checked = Checked()
    values = batch.raw.get("cache")
    default = job_cache(None, batch.overrides.cache)
    if values is None or pa.types.is_null(values.type):
        checked.resolved["cache"] = pa.array([default] * batch.size, pa.string())
        return checked
    encoded = pc.dictionary_encode(values.cast(pa.string()), null_encoding="encode")
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    canonical = []
    for code, value in enumerate(encoded.dictionary.to_pylist()):
        bad = problem(value)
        if bad:
            checked.problems.extend((int(offset), ORDER, "cache", bad) for offset in np.flatnonzero(codes == code))
        canonical.append(None if bad else job_cache(value, batch.overrides.cache))
    checked.resolved["cache"] = pa.DictionaryArray.from_arrays(
        encoded.indices, pa.array(canonical, pa.string())).dictionary_decode()
    return checked


def _fields(values: Mapping[str, object]) -> dict[str, object]:
    return {"cache": values["cache"]}


CACHE = RowInput(
    name="cache",
    columns=(Column("cache", "string", False,
                    "step caching: none, fbc:THRESHOLD or taylorseer:INTERVAL; overrides --cache"),),
    resolved=(("cache", pa.string()),),
    check=_check,
    job_fields=_fields,
    record=lambda job: {"cache": job.cache},
    # the cached state is not checkpointed, but a resumed job keeps its mode
    fingerprint=lambda job: {"cache": job.cache},
)
