"""The `audio` input: whether a row of a model that makes sound (LTX-2) writes its video with its sound.

`audio: false` makes a silent video: the sound is neither decoded nor written (the latents still denoise both
streams, as the pipeline's do, so the frames are the same as with sound). A null is the model's way: sound where
the model makes it. A model that makes no sound refuses any value, naming the models that do.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput

COLUMN = "audio"
ORDER = 45
"""Where its problems stand among a row's (after the media columns')."""


def audio_problem(model_name: str) -> str:
    """Why a row of a silent model cannot carry `audio`."""
    return (f"{model_name} makes no sound; drop the row's `audio` value (leave it null), or run the row on a model "
            "that makes sound (tiny-ltx2, ltx-2)")


def _check(batch: InputBatch) -> Checked:
    """Each row's `audio`: its own value, else whether its model makes sound; a value on a silent model's row is
    a problem."""
    checked = Checked()
    raw = batch.raw.get(COLUMN)
    given = (None if raw is None or pa.types.is_null(raw.type)
             else raw.to_numpy(zero_copy_only=False))  # object array of True / False / None
    resolved = np.zeros(batch.size, dtype=bool)
    for group in batch.groups():
        code = int(batch.codes[group[0]])
        model = batch.models[code]
        makes_sound = not isinstance(model, str) and model.spec.makes_sound
        resolved[group] = makes_sound
        if given is None:
            continue
        for offset in group.tolist():
            value = given[offset]
            if value is None:
                continue
            if isinstance(model, str):
                continue  # the row is rejected for its model
            if makes_sound:
                resolved[offset] = bool(value)
            else:
                checked.problems.append((offset, ORDER, COLUMN, audio_problem(batch.names[code])))
    checked.resolved[COLUMN] = pa.array(resolved, pa.bool_())
    return checked


def _fields(values: Mapping[str, object]) -> dict[str, object]:
    return {COLUMN: bool(values[COLUMN])}


AUDIO = RowInput(
    name="audio",
    columns=(Column(COLUMN, "bool", False,
                    "false: a model that makes sound (LTX-2) writes a silent video; null: the model's way"),),
    resolved=((COLUMN, pa.bool_()),),
    check=_check,
    job_fields=_fields,
    record=lambda job: {COLUMN: job.audio},
)
