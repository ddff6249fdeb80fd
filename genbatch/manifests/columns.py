"""The row rules over whole columns: a record batch checked with pyarrow compute, not Python per row.

The row's own rules (`validate`: id, prompt, seed, model, settings, sizes) and each per-row input's
(`genbatch.jobs.inputs.ROW_INPUTS`: its `check`) run over the batch's columns; vectorised masks find the rows a
rule may reject, and the rule's own message function runs on those rows only. A row's problems come in the
order of `ORDER` and the inputs' own. Valid rows never become Python objects: they come out as a record batch of
resolved columns (`genbatch.jobs.table.COLUMNS`, then the extra columns), one row per job (a row with
`num_outputs` K, K of them: `num_outputs.expand`). Models are resolved once per distinct name, sizes once per
distinct size (`validate.ModelRules`).

Duplicate ids need the whole id column: `first_uses` gives the rows whose id an earlier row has, and that row;
so do the ids `num_outputs` derives (`genbatch.manifests.id_space`, passed in as `collisions`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genbatch.jobs.inputs import ROW_INPUTS, InputBatch
from genbatch.jobs.inputs.base import flags as _flags
from genbatch.jobs.inputs.media import MEDIA_COLUMNS
from genbatch.jobs.inputs.num_outputs import expand
from genbatch.jobs.resolve import Resolved, resolve_model_name
from genbatch.jobs.schedule import SpecOf
from genbatch.jobs.spec import SETTINGS, VIDEO_SETTINGS, JobOverrides
from genbatch.jobs.table import COLUMNS
from genbatch.manifests import validate
from genbatch.manifests.validate import MAX_ID_BYTES, ModelRules, Rejection
from genbatch.models import resolve_model

WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""Every character `str.isspace` accepts, i.e. what `str.strip()` removes."""
_BLANK = r"\A[" + "".join(f"\\x{{{ord(char):x}}}" for char in WHITESPACE) + r"]*\z"
_UNSAFE_ID = r"[/\\\x00-\x1f\x7f]"  # the characters validate._UNSAFE_ID rejects, in RE2 syntax
_GEOMETRY = ("width", "height", "num_frames")

# Where a problem of each of the row's own columns stands among a row's problems (the inputs' come after).
_ORDER = {"id": 0, "prompt": 1, "seed": 2, "model": 3}
_VIDEO_ONLY_ORDER = {name: 4 + index for index, name in enumerate(VIDEO_SETTINGS)}
_SETTING_ORDER = {name: 10 + index for index, name in enumerate(SETTINGS)}
_GEOMETRY_ORDER = {name: 20 + index for index, name in enumerate(_GEOMETRY)}


def _plain(array: pa.Array) -> pa.Array:
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _int_type(array: pa.Array | None) -> pa.DataType:
    """The resolved column's type: int64, or uint64 for a uint64 manifest column (whose values may not fit)."""
    return pa.uint64() if array is not None and array.type == pa.uint64() else pa.int64()


def _ints(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    return array.cast(pa.from_numpy_dtype(dtype)).fill_null(0).to_numpy(zero_copy_only=False)


def id_problems(ids: pa.Array) -> dict[int, str]:
    """Offset -> why that id cannot be used (`validate.id_problem`), for a string array of ids; the regexes
    find the suspects, the rule's own function speaks."""
    suspects = (
        _flags(pc.is_null(ids))
        | _flags(pc.match_substring_regex(ids, _BLANK))
        | _flags(pc.match_substring_regex(ids, _UNSAFE_ID))
        | _flags(pc.is_in(ids, value_set=pa.array([".", ".."])))
        | _flags(pc.greater(pc.binary_length(ids), MAX_ID_BYTES))
    )
    offsets = np.flatnonzero(suspects)
    found = {}
    for offset, value in zip(offsets.tolist(), ids.take(offsets).to_pylist(), strict=True):
        problem = validate.id_problem(value)
        if problem:
            found[offset] = problem
    return found


def first_uses(ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(the rows whose id an earlier row already has, ascending; that earlier row's index, the first with the
    id). Sorting, not hashing: the memory is a few arrays of one entry per row, whatever the ids."""
    if pa.types.is_dictionary(ids.type):
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        ids = ids.dictionary_decode()
    ids = ids.cast(pa.string())
    if len(ids) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = pc.sort_indices(ids).to_numpy().astype(np.int64)  # stable (rows ascending), nulls at the end
    ordered = ids.take(order)
    repeats = np.flatnonzero(_flags(pc.equal(ordered.slice(1), ordered.slice(0, len(ids) - 1)))) + 1
    if not len(repeats):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.diff(repeats) != 1) + 1  # runs of consecutive repeats: one run per repeated id
    run_start = np.zeros(len(repeats), dtype=np.int64)
    run_start[starts] = 1
    run = np.cumsum(run_start)
    first_position = (repeats[np.r_[0, starts]] - 1)[run]  # the sorted position just before each run
    rows, firsts = order[repeats], order[first_position]
    by_row = np.argsort(rows, kind="stable")
    return rows[by_row], firsts[by_row]


class ColumnChecker:
    """Checks record batches in manifest order: the row's own rules and every per-row input's."""

    def __init__(
        self, *, overrides: JobOverrides, extra_columns: Sequence[str], first_use: tuple[np.ndarray, np.ndarray],
        media_base: str | None = None, collisions: dict[int, list[tuple[str, str]]] | None = None,
        spec_of: SpecOf = resolve_model,
    ) -> None:
        self.overrides = overrides
        """The run-level options."""
        self.extra_columns = tuple(extra_columns)
        """Columns carried into the jobs and rejections."""
        self.first_use = first_use
        """`first_uses` of the manifest's whole id column."""
        self.media_base = media_base
        """Where a relative media path points from: the manifest's directory (`jobs.media.manifest_base`)."""
        self.collisions = collisions or {}
        """Row -> its (column, reason) job-id collisions over the whole manifest (`id_space.collisions`)."""
        self._rules = ModelRules(overrides, spec_of)
        """The models rows name, resolved by `spec_of` once each."""

    def check(self, first_row: int, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[Rejection]]:
        """The batch's valid rows' jobs as resolved columns (one per output of a row's `num_outputs`), and one
        `Rejection` per problem of the other rows."""
        size = batch.num_rows
        raw = {name: _plain(batch.column(name)) for name in batch.schema.names}
        strings = {
            name: raw[name].cast(pa.string()) if name in raw else pa.nulls(size, pa.string())
            for name in ("id", "prompt", "negative_prompt", "model", *MEDIA_COLUMNS)
        }
        problems: list[tuple[int, int, str, str]] = []  # (offset in the batch, order in the row, column, reason)
        bad_ids = self._ids(first_row, strings["id"], problems)
        self._prompts(strings["prompt"], problems)
        self._seeds(raw.get("seed"), problems)
        encoded = pc.dictionary_encode(strings["model"], null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        names = [resolve_model_name(value, self.overrides) for value in encoded.dictionary.to_pylist()]
        models = [self._rules.model(name) for name in names]
        resolved = {name: self._start_setting(name, raw.get(name), size) for name in SETTINGS}
        view = InputBatch(first_row=first_row, size=size, raw=raw, strings=strings, overrides=self.overrides,
                          media_base=self.media_base, names=names, models=models, codes=codes, bad_ids=bad_ids,
                          collisions=self.collisions)
        for group in view.groups():
            code = int(codes[group[0]])
            self._check_group(group, names[code], models[code], raw, resolved, problems)
        inputs: dict[str, pa.Array] = {}
        counts = np.ones(size, np.int64)
        for row_input in ROW_INPUTS:
            checked = row_input.check(view)
            inputs.update(checked.resolved)
            problems.extend(checked.problems)
            if checked.counts is not None:
                counts = checked.counts
        rejected = np.zeros(size, dtype=bool)
        rejected[[offset for offset, *_ in problems]] = True
        accepted = np.flatnonzero(~rejected)
        jobs = self._jobs(first_row, batch, strings, raw.get("seed"), codes, names, resolved, inputs, accepted)
        rejections = self._rejections(first_row, batch, strings["id"], codes, names, problems)
        return expand(jobs, counts[accepted]), rejections

    # ---- row problems ---------------------------------------------------------------------------------
    def _ids(self, first_row: int, ids: pa.Array, problems: list) -> np.ndarray:
        """Check the ids; the rows whose id is unusable."""
        bad = np.zeros(len(ids), dtype=bool)
        for offset, problem in id_problems(ids).items():
            problems.append((offset, _ORDER["id"], "id", problem))
            bad[offset] = True
        rows, firsts = self.first_use
        low, high = np.searchsorted(rows, [first_row, first_row + len(ids)])
        for row, first in zip(rows[low:high].tolist(), firsts[low:high].tolist(), strict=True):
            if not bad[row - first_row]:
                problems.append((row - first_row, _ORDER["id"], "id", validate.duplicate_problem(first)))
        return bad

    @staticmethod
    def _prompts(prompts: pa.Array, problems: list) -> None:
        suspects = _flags(pc.is_null(prompts)) | _flags(pc.match_substring_regex(prompts, _BLANK))
        offsets = np.flatnonzero(suspects)
        for offset, value in zip(offsets.tolist(), prompts.take(offsets).to_pylist(), strict=True):
            if value is None or not value.strip():
                problems.append((offset, _ORDER["prompt"], "prompt", validate.EMPTY_PROMPT))

    @staticmethod
    def _seeds(seeds: pa.Array | None, problems: list) -> None:
        if seeds is None or seeds.type != pa.uint64():  # every other integer type fits in int64
            return
        offsets = np.flatnonzero(_flags(pc.greater(seeds, pa.scalar(np.iinfo(np.int64).max, pa.uint64()))))
        for offset, value in zip(offsets.tolist(), seeds.take(offsets).to_pylist(), strict=True):
            problems.append((offset, _ORDER["seed"], "seed", validate.seed_problem(value)))

    @staticmethod
    def _setting_suspects(name: str, values: pa.Array) -> np.ndarray:
        """Rows whose own value `_setting_problem` may reject (nulls: false)."""
        if name == "guidance_scale":
            floats = values.cast(pa.float64(), safe=False)
            return _flags(pc.invert(pc.is_finite(floats))) | _flags(pc.less(floats, 0))
        return _flags(pc.less_equal(values, 0))

    def _row_values(self, name: str, values: pa.Array | None, group: np.ndarray, problems: list) -> np.ndarray:
        """Check the rows' own values of one setting; the rows of `group` found bad."""
        bad = np.zeros(len(group), dtype=bool)
        if values is None or pa.types.is_null(values.type):
            return bad
        mine = values.take(group)
        flagged = np.flatnonzero(self._setting_suspects(name, mine))
        for index, value in zip(flagged.tolist(), mine.take(flagged).to_pylist(), strict=True):
            problem = validate.setting_problem(name, Resolved(value, "row"))
            if problem:
                problems.append((int(group[index]), _SETTING_ORDER[name], name, problem))
                bad[index] = True
        return bad

    def _check_group(self, group, model_name, model, raw, resolved, problems) -> None:
        """The problems of the rows of one model (`model`: the resolved model, or why it cannot be used)."""
        if isinstance(model, str):
            problems.extend((offset, _ORDER["model"], "model", model) for offset in group.tolist())
            for name in SETTINGS:  # without a model only the rows' own values can be checked
                self._row_values(name, raw.get(name), group, problems)
            return
        spec = model.spec
        nulls = {name: self._nulls(raw.get(name), group) for name in SETTINGS}
        if not spec.is_video:
            for name in VIDEO_SETTINGS:
                problem = validate.video_only_problem(name, model_name)
                problems.extend((int(offset), _VIDEO_ONLY_ORDER[name], name, problem) for offset in group[~nulls[name]])
        fallbacks = model.resolver.resolve({})  # what a null takes, for every setting of this model
        bad = {}
        for name, fallback in fallbacks.items():
            bad[name] = self._row_values(name, raw.get(name), group, problems)
            problem = validate.setting_problem(name, fallback)
            if problem:
                problems.extend((int(offset), _SETTING_ORDER[name], name, problem) for offset in group[nulls[name]])
                bad[name] |= nulls[name]
            self._fill(resolved[name], group, nulls[name], fallback)
        for name in VIDEO_SETTINGS:
            if name not in fallbacks:
                resolved[name][1][group] = True  # image models: null
        self._geometry(group, spec, raw, fallbacks, nulls, bad, problems)

    def _geometry(self, group, spec, raw, fallbacks, nulls, bad, problems) -> None:
        sizes = [name for name in _GEOMETRY if name in fallbacks]
        usable = ~np.logical_or.reduce([bad[name] for name in sizes])
        values = {}
        for name in sizes:
            fallback = fallbacks[name]
            column = raw.get(name)
            own = (np.zeros(len(group), np.int64) if column is None or pa.types.is_null(column.type)
                   else _ints(column.take(group), np.dtype(np.uint64 if column.type == pa.uint64() else np.int64)))
            values[name] = np.where(nulls[name], own.dtype.type(fallback.value if fallback else 1), own)
        multiple = spec.size_multiple
        suspects = (values["width"] % multiple != 0) | (values["height"] % multiple != 0)
        if "num_frames" in values:
            suspects |= (values["num_frames"] - 1) % spec.frame_multiple != 0
        for index in np.flatnonzero(usable & suspects).tolist():
            offset = int(group[index])
            settings = {
                name: fallbacks[name] if nulls[name][index] else Resolved(raw[name][offset].as_py(), "row")
                for name in sizes
            }
            problems.extend(
                (offset, _GEOMETRY_ORDER[column], column, reason)
                for column, reason in self._rules.geometry_problems(spec, settings)
            )

    @staticmethod
    def _nulls(values: pa.Array | None, group: np.ndarray) -> np.ndarray:
        if values is None:
            return np.ones(len(group), dtype=bool)
        return _flags(pc.is_null(values.take(group)))

    # ---- valid rows: resolved columns -----------------------------------------------------------------
    @staticmethod
    def _start_setting(name: str, values: pa.Array | None, size: int) -> tuple[np.ndarray, np.ndarray, pa.DataType]:
        """(values, null flags, type) of one resolved setting, from the rows' own values."""
        kind = pa.float64() if name == "guidance_scale" else _int_type(values)
        if values is None or pa.types.is_null(values.type):
            return np.zeros(size, kind.to_pandas_dtype()), np.ones(size, dtype=bool), kind
        nulls = _flags(pc.is_null(values))
        if name == "guidance_scale":
            numbers = values.cast(pa.float64(), safe=False).fill_null(0.0).to_numpy(zero_copy_only=False)
        else:
            numbers = _ints(values, np.dtype(kind.to_pandas_dtype()))
        return numbers.copy(), nulls, kind

    @staticmethod
    def _fill(setting, group: np.ndarray, nulls: np.ndarray, fallback: Resolved | None) -> None:
        if fallback is None:
            return  # those rows are rejected ("no value")
        numbers, null_flags, _ = setting
        targets = group[nulls]
        numbers[targets] = fallback.value
        null_flags[targets] = False

    def _jobs(self, first_row, batch, strings, seeds, codes, names, resolved, inputs, accepted) -> pa.RecordBatch:
        """The accepted rows' resolved columns, in `COLUMNS` order, then the extra columns."""
        take = pa.array(accepted, pa.int64())
        models = pa.DictionaryArray.from_arrays(pa.array(codes[accepted], pa.int32()), pa.array(names, pa.string()))
        columns = {name: strings[name].take(take) for name in ("id", "prompt", "negative_prompt")}
        columns["source_id"] = columns["id"]  # the row's id: `num_outputs.expand` gives its outputs theirs
        columns["model"] = models.dictionary_decode()
        for name in SETTINGS:
            numbers, nulls, kind = resolved[name]
            columns[name] = pa.array(numbers[accepted], type=kind, mask=nulls[accepted])
        for name, values in inputs.items():
            columns[name] = values.take(take)
        columns["seed"] = (pa.nulls(len(accepted), pa.int64()) if seeds is None
                           else seeds.take(take).cast(pa.int64()))
        columns["row"] = pa.array(first_row + accepted, pa.int64())
        ordered = {name: columns[name] for name in COLUMNS}
        for name in self.extra_columns:
            ordered[name] = batch.column(name).take(take)
        return pa.record_batch(list(ordered.values()), names=list(ordered))

    def _rejections(self, first_row, batch, ids, codes, names, problems) -> list[Rejection]:
        if not problems:
            return []
        problems.sort(key=lambda problem: (problem[0], problem[1]))
        offsets = sorted({offset for offset, *_ in problems})
        index = pa.array(offsets, pa.int64())
        row_ids = dict(zip(offsets, ids.take(index).to_pylist(), strict=True))
        extras = batch.select(list(self.extra_columns)).take(index).to_pylist() if self.extra_columns else None
        row_extra = dict(zip(offsets, extras, strict=True)) if extras is not None else {}
        return [
            Rejection(row=first_row + offset, job_id=row_ids[offset] or None, column=column, reason=reason,
                      model=names[codes[offset]], extra=row_extra.get(offset, {}))
            for offset, _, column, reason in problems
        ]
