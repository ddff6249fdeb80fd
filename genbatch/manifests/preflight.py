"""Run-level checks, made once before any row is validated: the options every row depends on.

A problem here belongs to the run, not to a row: a `--model` that does not exist or a misspelled preset, a
run-level size (`--width --height --frames`) the run's model cannot take, rows that name no model while no
`--model` is given, an `--out` that cannot be written. Rejecting every row for the same cause would bury it
under one line per row and end the run "successfully" with nothing made; instead `gen run` and `gen
validate` stop before any work with exit 2 and one message naming the flag and the fix.
"""

from __future__ import annotations

import difflib
import json
import os
import uuid

from genbatch.jobs.cache import TEACACHE, parse_cache
from genbatch.models.spec import ModelSpec
from genbatch.jobs.spec import JobOverrides
from genbatch.manifests.reader import ManifestReader
from genbatch.jobs.schedule import SpecOf
from genbatch.models.teacache import covered_model, not_covered
from genbatch.models import known_names, published_model, registry, resolve_model

_SIZE_FLAGS = {"width": "--width", "height": "--height", "num_frames": "--frames"}
"""The run-level size settings and the flags that set them."""


class RunOptionError(ValueError):
    """A run-level option that cannot work for any row: nothing runs, exit 2. The message names the flag."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option
        """The flag at fault, e.g. `--model`."""


def _suggestion(name: str) -> str:
    """`; did you mean 'tiny-wan'?` for a near miss of a preset's or published model's name, else empty."""
    close = difflib.get_close_matches(name, known_names(), n=3, cutoff=0.8)
    return f"; did you mean {' or '.join(repr(preset) for preset in close)}?" if close else ""


def check_model(name: str, spec_of: SpecOf = resolve_model) -> ModelSpec:
    """The run's `--model`, resolved by `spec_of`; `RunOptionError` naming `--model`, the cause and the closest
    names."""
    try:
        return spec_of(name)
    except (ValueError, OSError) as error:  # UnknownModelError, and whatever resolving a hub id raises
        raise RunOptionError("--model", f"--model {name!r}: {error}{_suggestion(name)}") from None


def check_sizes(spec: ModelSpec, overrides: JobOverrides) -> None:
    """`RunOptionError` when a run-level size (`--width --height --frames`) is one the run's model cannot take."""
    given = {name: overrides.value(name) for name in _SIZE_FLAGS if overrides.value(name) is not None}
    if not spec.is_video:
        given.pop("num_frames", None)  # ignored for image models, as for rows
    if not given:
        return
    # Sizes not given are replaced by one the model always takes, so only the given ones can be at fault.
    problems = spec.geometry_problems(
        given.get("width", spec.size_multiple), given.get("height", spec.size_multiple), given.get("num_frames")
    )
    if problems:
        column, reason = problems[0]
        flag = _SIZE_FLAGS[column]
        raise RunOptionError(
            flag, f"{flag} {given[column]} cannot be used with model {spec.name}: {reason}; pass a size it takes"
        )


def check_options(overrides: JobOverrides, spec_of: SpecOf = resolve_model) -> None:
    """The checks that need no file: the run's model exists (`spec_of` resolves it) and takes the run-level
    sizes."""
    if overrides.model is not None:
        spec = check_model(overrides.model, spec_of)
        check_sizes(spec, overrides)
        check_cache(spec, overrides)


def _transformer_config(spec: ModelSpec) -> tuple[str, dict, int]:
    """(transformer class, its config, the pipeline's denoisers) from the small JSON files (a preset, or a published
    model read from its published configs: its family's first transformer class and that config)."""
    if spec.path is None:
        family, configs = registry.presets().get(spec.name) or published_model(spec.name)
        return next(iter(family.transformers)), dict(configs.transformer), 1
    with open(os.path.join(spec.path, "model_index.json"), encoding="utf-8") as handle:
        index = json.load(handle)
    with open(os.path.join(spec.path, "transformer", "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    experts = 1 + bool((index.get("transformer_2") or [None])[0])
    return config.get("_class_name", ""), config, experts


def check_cache(spec: ModelSpec, overrides: JobOverrides) -> None:
    """`RunOptionError` naming `--cache` when the run-level mode is TeaCache and the model has no published
    coefficients (`genbatch.models.teacache`)."""
    if parse_cache(overrides.cache).kind == TEACACHE and covered_model(*_transformer_config(spec)) is None:
        raise RunOptionError("--cache", f"--cache {overrides.cache}: {not_covered(spec.name)}")


def rows_without_model(reader: ManifestReader) -> int:
    """Rows of an open manifest whose `model` is null (every row when there is no `model` column)."""
    if "model" not in reader.schema.columns:
        return reader.rows
    return sum(batch.column(0).null_count for batch in reader.column_batches(["model"]))


def check_rows_have_model(reader: ManifestReader, overrides: JobOverrides) -> None:
    """Without `--model`, every row must name its model: `RunOptionError` naming `--model` and the count."""
    if overrides.model is not None:
        return
    missing = rows_without_model(reader)
    if missing:
        raise RunOptionError(
            "--model",
            f"{missing} of {reader.rows} rows have no `model` value and no --model was given; pass --model "
            "with a preset or published model (`gen models` lists them), a hub id or a diffusers pipeline "
            "directory, or fill the manifest's `model` column",
        )


def probe_output(store) -> None:
    """Create and delete one small object under the run's URL (a `genbatch.io.RunStore`), so an `--out` that
    cannot be written stops the run before any work. A transient storage failure past the retry bound is
    raised as it is (`StorageError`): retrying later may succeed."""
    from genbatch.io import StorageError

    path = store.layout.join(f".write-probe-{uuid.uuid4().hex[:12]}")
    try:
        store.objects.write_whole(path, b"genbatch write probe\n")
        store.objects.remove(path)
    except StorageError as error:
        if error.transient:
            raise
        raise RunOptionError("--out", _unwritable(store.url, error)) from None
    except OSError as error:
        raise RunOptionError("--out", _unwritable(store.url, error)) from None


def _unwritable(url: str, error: BaseException) -> str:
    return (
        f"--out {url} cannot be written ({type(error).__name__}: {error}); pass a path or URL this process may "
        "write, and for object storage check the bucket and the credentials and endpoint given with "
        "--storage-option"
    )
