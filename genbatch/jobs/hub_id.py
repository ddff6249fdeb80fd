"""A Hugging Face hub id as a user writes one, `org/name` or `org/name@revision`: for models (`--model`,
`genbatch.models.hub`) and adapters (`genbatch.jobs.lora`). Only the spelling; nothing here looks anything up."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_ID = re.compile(rf"^(?P<repo>{_SEGMENT}/{_SEGMENT})(?:@(?P<revision>[^@\s/][^@\s]*))?$")

@dataclass(frozen=True, kw_only=True, slots=True)
class HubId:
    """A model on the Hugging Face hub, as a user names it: `org/name` or `org/name@revision`."""

    repo: str
    """The repository id, `org/name`."""
    revision: str | None = None
    """A branch, tag or commit hash; None for the default branch (`main`)."""
    files: tuple[str, ...] = ()
    """Only these files of the repository (an adapter's `weight_name` in a repository of many); (): all of it."""

    @property
    def name(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"

    def fill_command(self) -> str:
        """The command that puts this model into the cache."""
        revision = f" --revision {self.revision}" if self.revision else ""
        files = "".join(f" {name}" for name in self.files)
        return f"hf download {self.repo}{files}{revision}"


def parse_hub_id(name: str) -> HubId | None:
    """The hub id `name` spells (`org/name`, `org/name@rev`), or None when it is no hub id (a path, a preset)."""
    match = _HUB_ID.match(name)
    if match is None:
        return None
    return HubId(repo=match["repo"], revision=match["revision"])
