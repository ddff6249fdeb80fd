"""Hub models into each node's cache before the manifest is validated: one rank per node downloads.

    rank 0        names = the hub ids among --model and the manifest's `model` column (a published model's name:
                  its hub id), and the adapters' (only their `weight_name` file when a row names one) -> store
    LOCAL_RANK 0  (one per node) for each name not in this node's cache: fetch (huggingface_hub), if allowed
    every rank    waits on the store until every rank is ready, then resolves offline from the cache

The waits poll the process group's key-value store, never a collective: a download may take far longer
than --collective-timeout without cutting a waiting rank off. A stop signal (SIGTERM/SIGUSR1) ends a wait,
and the download itself (run in a thread, so the flag is seen): huggingface_hub keeps the partial files and a
rerun continues them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from genbatch.models.hub import HubId, HubModelMissing, cached_snapshot, download_allowed, fetch_snapshot

if TYPE_CHECKING:
    from genbatch.parallel.context import ParallelContext
    from genbatch.runner.options import RunOptions
    from genbatch.runner.signals import StopRequest


class DownloadStopped(Exception):
    """A stop signal arrived while this rank waited for models (nothing half-done is kept but the cache's)."""


def hub_ids(names: Iterable[str | HubId | None]) -> list[HubId]:
    """The distinct hub ids among `names` (spelled, stood for by a published model's name, or already parsed), in
    first-seen order (presets and existing directories are none)."""
    from genbatch.models import model_hub_id

    found: dict[HubId, None] = {}
    for name in names:
        if isinstance(name, HubId):
            found.setdefault(name)
            continue
        hub = model_hub_id(name) if name else None
        if hub is not None:
            found.setdefault(hub)
    return list(found)


def _column_values(url: str, column: str, storage_options: dict | None, values_of) -> list:
    """The sorted distinct values (strings, hub ids) `values_of(batch column)` gives over the manifest's
    `column` (empty when it has no such column or cannot be read: the manifest's own reading reports that)."""
    from genbatch.manifests import ManifestReader

    try:
        with ManifestReader(url, storage_options=storage_options) as reader:
            if column not in reader.schema.arrow.names:
                return []
            values: set = set()
            for batch in reader.column_batches([column]):
                values.update(values_of(batch.column(0)))
            return sorted(values, key=repr)
    except Exception:  # noqa: BLE001 - a missing or broken manifest is reported by the manifest reader
        return []


def manifest_model_names(url: str, storage_options: dict | None = None) -> list[str]:
    """The distinct values of the manifest's `model` column."""
    import pyarrow.compute as pc

    return _column_values(url, "model", storage_options, lambda values: (
        value for value in pc.unique(values).to_pylist() if isinstance(value, str)))


def manifest_adapter_ids(url: str, storage_options: dict | None = None) -> list[HubId]:
    """The distinct hub ids the manifest's `lora` column names (`org/name[@revision]`, with its `weight_name`),
    to download as models are."""
    import pyarrow.compute as pc

    from genbatch.jobs.lora import adapter_hub_id, is_hub_uri

    def hub_adapters(values):
        entries = pc.list_flatten(values)
        if not len(entries):
            return []
        names = [field.name for field in entries.type]
        uris = pc.struct_field(entries, "uri").to_pylist()
        weights = pc.struct_field(entries, "weight_name").to_pylist() if "weight_name" in names else [None] * len(uris)
        return (adapter_hub_id(uri, weight) for uri, weight in dict.fromkeys(zip(uris, weights, strict=True))
                if isinstance(uri, str) and is_hub_uri(uri.strip()))

    return _column_values(url, "lora", storage_options, hub_adapters)


@dataclass(kw_only=True, slots=True)
class ModelFetch:
    """One node's share of getting hub models into the cache before a run validates its manifest."""

    allowed: bool
    """Whether a model missing from the cache may be downloaded (`--download`, default: not HF_HUB_OFFLINE)."""
    fetch: Callable[[HubId], object] = fetch_snapshot
    """Downloads one model into the cache (huggingface_hub's snapshot_download; tests pass a stand-in)."""
    stopped: Callable[[], bool] = lambda: False
    """True once a stop signal arrived: waits and downloads end with `DownloadStopped`."""
    poll_s: float = 0.05
    """First pause between looks at the store (doubling up to 0.5 s)."""
    quiet: bool = False
    failures: dict[str, str] = field(default_factory=dict)
    """{model name: why it is not in the cache}: filled on the node's downloading rank."""

    def fill_cache(self, hubs: Iterable[HubId]) -> dict[str, str]:
        """Download each of `hubs` missing from this node's cache (when allowed); {name: why not} of the rest."""
        for hub in hubs:
            try:
                cached_snapshot(hub)
                continue
            except HubModelMissing as miss:
                if not self.allowed:
                    self.failures[hub.name] = str(miss)
                    continue
            if not self.quiet:
                print(f"genbatch: downloading {hub.name} into the Hugging Face cache", file=sys.stderr, flush=True)
            try:
                self._in_thread(lambda hub=hub: self.fetch(hub))
            except DownloadStopped:
                raise
            except Exception as error:  # noqa: BLE001 - named; the rows of this model are rejected later
                self.failures[hub.name] = f"download failed ({type(error).__name__}: {error})"
                print(f"genbatch: downloading {hub.name} failed ({type(error).__name__}: {error}); its rows will "
                      f"be rejected. Fill the cache with `{hub.fill_command()}`", file=sys.stderr, flush=True)
        return dict(self.failures)

    def _in_thread(self, work: Callable[[], object]) -> None:
        """Run `work` in a thread, so that a stop signal (only a flag here) is seen while it runs."""
        outcome: list[BaseException | None] = []

        def target() -> None:
            try:
                work()
                outcome.append(None)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                outcome.append(error)

        thread = threading.Thread(target=target, name="genbatch-download", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.2)
            if self.stopped():
                raise DownloadStopped("stopped by signal while downloading")
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Poll `ready` (a store lookup) until it is true, however long; a stop signal ends the wait."""
        pause = self.poll_s
        while not ready():
            if self.stopped():
                raise DownloadStopped("stopped by signal while waiting for a model download")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def run(self, *, names: Callable[[], list[str | HubId]], store, key: str, rank: int, local_rank: int,
            world_size: int) -> dict[str, str]:
        """Every rank calls this: rank 0 computes `names()`, each node's LOCAL_RANK 0 fills its cache, and all
        return once every node is done. `store` is the process group's (None: one process). {name: why not}."""
        if store is None:
            return self.fill_cache(hub_ids(names()))
        names_key, ready_key = f"{key}/names", f"{key}/ready"
        if rank == 0:
            store.set(names_key, json.dumps([asdict(hub) for hub in hub_ids(names())]))
        if local_rank == 0:
            self.wait_until(lambda: store.check([names_key]))
            listed = json.loads(store.get(names_key))
            self.fill_cache(HubId(repo=hub["repo"], revision=hub["revision"], files=tuple(hub["files"]))
                            for hub in listed)
        store.add(ready_key, 1)
        self.wait_until(lambda: store.add(ready_key, 0) >= world_size)
        return dict(self.failures)


def prepare_models(options: RunOptions, ctx: ParallelContext, run_id: str, stop: StopRequest | None = None) -> None:
    """Get the run's hub models into every node's cache (see the module docstring); raises `DownloadStopped`."""
    from genbatch.jobs.lora import adapter_hub_id

    from genbatch.runner.handout import coordination_store

    model, storage = options.model, dict(options.storage.options)
    fetcher = ModelFetch(allowed=download_allowed(model.download),
                         stopped=(lambda: stop.requested) if stop is not None else (lambda: False),
                         quiet=options.quiet)
    fetcher.run(
        names=lambda: [model.model, model.overrides.model,
                       *manifest_model_names(options.manifest, storage),
                       *(adapter_hub_id(adapter.uri, adapter.weight_name) for adapter in model.overrides.lora
                         if adapter.is_hub_id),
                       *manifest_adapter_ids(options.manifest, storage)],
        store=coordination_store(ctx) if ctx.distributed else None,
        key=f"genbatch/{run_id}/hub",
        rank=ctx.rank,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=ctx.dims.world_size,
    )
