"""Models named by Hugging Face hub id (`org/name`, `org/name@revision`), found in the local hub cache.

Resolution follows diffusers' `from_pretrained`: an existing local directory of that name wins (the caller
checks that first); otherwise the id is looked up in the cache that `huggingface_hub` fills (`HF_HUB_CACHE`,
else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), laid out as `models--org--name/snapshots/<commit>/...`
with `refs/<branch>` naming the commit. Looking up never touches the network; `fetch_snapshot` downloads,
and only the runner calls it (one rank per node, see `genbatch.runner.download`).
"""

from __future__ import annotations

import os

from genbatch.jobs.hub_id import HubId, parse_hub_id  # noqa: F401 - spelled there, looked up here

_FALSE = {"", "0", "false", "no", "off"}


def hub_cache_dir() -> str:
    """The cache `huggingface_hub` reads and fills, from the environment as it is now (as huggingface_hub's
    own constants do at import): HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE asks for no network access (huggingface_hub's own reading of it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in _FALSE


def download_allowed(flag: bool | None) -> bool:
    """Whether a missing model may be downloaded: `--download/--no-download` when given, else not when
    HF_HUB_OFFLINE is set."""
    return (not hub_offline()) if flag is None else flag


class HubModelMissing(LookupError):
    """A hub model is not in the local cache (and was not downloaded)."""


def miss_message(hub: HubId, cache: str, incomplete: bool = False, published: str | None = None) -> str:
    """Why `hub` cannot be read, and the fix; `published`: the published model's name that stands for it."""
    revision = f" at revision {hub.revision!r}" if hub.revision else ""
    state = "is only partly in" if incomplete else "is not in"  # partly: a download that was cut off
    what = (f"model {hub.name!r} is not a local directory, and hub model {hub.repo}{revision}" if published is None
            else f"published model {published!r}, hub model {hub.repo}{revision},")
    return (
        f"{what} {state} the "
        f"Hugging Face cache {cache} (searched offline; set by HF_HUB_CACHE or HF_HOME); fill the cache with "
        f"`{hub.fill_command()}` (same HF_HUB_CACHE/HF_HOME), or let `gen run` download it with --download"
    )


def cached_snapshot(hub: HubId, cache: str | None = None, published: str | None = None) -> str:
    """The snapshot directory of `hub` in the cache; raises `HubModelMissing` naming the cache and the fix (and
    `published`, the published model's name that stands for `hub`, when given)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    cache = cache or hub_cache_dir()
    try:
        return snapshot_download(hub.repo, revision=hub.revision, cache_dir=cache, local_files_only=True,
                                 allow_patterns=list(hub.files) or None)
    except LocalEntryNotFoundError as error:  # IncompleteSnapshotError too: files of the listing are missing
        raise HubModelMissing(miss_message(hub, cache, isinstance(error, IncompleteSnapshotError), published)) from None


def fetch_snapshot(hub: HubId, cache: str | None = None) -> str:
    """Download `hub` into the cache with huggingface_hub (files already there are kept); its snapshot path."""
    from huggingface_hub import snapshot_download

    return snapshot_download(hub.repo, revision=hub.revision, cache_dir=cache or hub_cache_dir(),
                             allow_patterns=list(hub.files) or None)
