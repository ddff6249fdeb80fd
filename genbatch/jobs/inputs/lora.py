"""The `lora` input: a row's LoRA adapters (`genbatch.jobs.lora`), else the run's `--lora`; read, converted,
checked against the model and switched in before its batch runs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput, flags
from genbatch.jobs.lora import LoraRef, from_text, lora_text, parse_lora

ORDER = 50
"""Where its problems stand among a row's."""


def job_adapters(value: object, run_adapters: tuple[LoraRef, ...], base: str | None) -> tuple[LoraRef, ...] | str:
    """A row's adapters (its `lora`, else the run's `--lora`), or the reason its value cannot be used."""
    try:
        adapters = parse_lora(value, base)
    except ValueError as error:
        return f"{error}; or leave it null for the run's --lora"
    return run_adapters if adapters is None else adapters


def _check(batch: InputBatch) -> Checked:
    """The resolved `lora` column (`lora_text`; the run's `--lora` for nulls); only rows that name adapters
    become Python values."""
    checked = Checked()
    values = batch.raw.get("lora")
    default = lora_text(batch.overrides.lora)
    texts = [default] * batch.size
    if values is not None and not pa.types.is_null(values.type) and values.null_count < len(values):
        named = np.flatnonzero(~flags(pc.is_null(values)))
        for offset, value in zip(named.tolist(), values.take(pa.array(named, pa.int64())).to_pylist(), strict=True):
            adapters = job_adapters(value, batch.overrides.lora, batch.media_base)
            if isinstance(adapters, str):
                checked.problems.append((offset, ORDER, "lora", adapters))
            else:
                texts[offset] = lora_text(adapters)
    checked.resolved["lora"] = pa.array(texts, pa.string())
    return checked


def _fingerprint(job) -> dict[str, object]:
    # a changed adapter, or another scale, restarts the job
    if not job.lora:
        return {}
    return {"lora": [[ref.uri, ref.weight_name, ref.scale, digest, *([ref.expert] if ref.expert else [])]
                     for ref, digest in zip(job.lora, job.lora_sha256, strict=True)]}


def _fields(values: Mapping[str, object]) -> dict[str, object]:
    return {"lora": from_text(values["lora"])}


LORA = RowInput(
    name="lora",
    columns=(Column("lora", "lora", False,
                    "LoRA adapters: a list of {uri, scale, weight_name, expert}; null takes --lora"),),
    resolved=(("lora", pa.string()),),
    check=_check,
    job_fields=_fields,
    record=lambda job: {"lora": lora_text(job.lora)},
    prepared_record=lambda job: {"lora": lora_text(job.lora, job.lora_sha256)},
    fingerprint=_fingerprint,
    shapes_encode=True,  # an adapter of a text encoder changes the encode
    prepare="genbatch.runner.prepare_inputs:switch_adapters",
)
