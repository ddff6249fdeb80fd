"""What a manifest's rows may make a rank read: the allowed URL prefixes, the refused addresses, the size bound.

A row's `image` (and later its `lora`) is a URL the manifest's author chose, read with the run's credentials.
So a rank reads only what the run allows:

    policy = MediaPolicy.for_manifest("s3://team/batch/manifest.parquet", allow=("https://cdn.example.com/art",))
    policy.outside("s3://team/batch/img/a.png")     -> None (inside s3://team/batch)
    policy.outside("/etc/shadow")                  -> "outside the allowed media prefixes (...); add --media-allow ..."
    refused_address("169.254.169.254")             -> True (never read over http(s), whatever is allowed)

- **Prefixes** (`--media-allow`, repeatable): paths, `s3://bucket/prefix`, `https://host/path`. The default is the
  manifest's own directory or bucket prefix, plus the Hugging Face hub cache (for hub ids). A local URL is
  resolved first (`..` and symlinks), so one that leaves an allowed prefix that way is outside it; a prefix
  matches whole path segments (`/data/a` admits `/data/a/x.png`, not `/data/ab.png`).
- **Addresses**: link-local (169.254.0.0/16, fe80::/10), the EC2 IPv6 metadata address fd00:ec2::254 and
  Google's metadata names are never read over http(s), nor any network in `--media-refuse`. A host name is
  judged by every address it resolves to, and so is every redirect's target (`genbatch.io.http_read`).
- **Size**: one row's input image is at most `--media-max-mib` (default 64) MiB; a larger file is not read.

Every refusal names the URL and the reason, never a byte of the file.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MEDIA_MAX_MIB = 64.0
"""`--media-max-mib`'s default: the most MiB one row's input image may have."""

REFUSED_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),  # IPv4 link-local: the EC2, Azure, GCP and OpenStack metadata services
    ipaddress.ip_network("fe80::/10"),  # IPv6 link-local
    ipaddress.ip_network("fd00:ec2::254/128"),  # EC2's IPv6 metadata service
)
"""Networks never read over http(s), whatever `--media-allow` names."""

REFUSED_HOSTS = ("metadata.google.internal", "metadata.goog", "metadata")
"""Host names never read over http(s) (GCP's metadata service), before any lookup."""

HTTP_SCHEMES = ("http", "https")


class MediaRefused(ValueError):
    """A URL the run's media policy does not let a rank read; the message names the URL, the reason and the fix."""


def _networks(items) -> tuple:
    return tuple(item if not isinstance(item, str) else ipaddress.ip_network(item, strict=False) for item in items)


def parse_networks(items) -> tuple:
    """`--media-refuse` values (CIDRs or single addresses) as networks; ValueError naming a bad one."""
    parsed = []
    for item in items:
        try:
            parsed.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--media-refuse {item!r} is not an address or network: write e.g. 10.0.0.0/8 or "
                             "192.168.1.7") from None
    return tuple(parsed)


def refused_address(address: str, extra_networks=()) -> bool:
    """Whether `address` (a literal IP or a host name, no lookup) is never to be read over http(s)."""
    host = address.strip().strip("[]").rstrip(".").lower()
    if host in REFUSED_HOSTS:
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is no way around the rule
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return any(ip.version == network.version and ip in network
               for network in REFUSED_NETWORKS + _networks(extra_networks))


def literal_refusal(host: str, extra_networks=()) -> str | None:
    """Why `host` as written (a refused name or literal address, no lookup) may not be read over http(s)."""
    if refused_address(host, extra_networks):
        return f"{host} is a refused address (link-local, metadata service or --media-refuse)"
    return None


def host_refusal(host: str, port: int | None, extra_networks=()) -> str | None:
    """Why `host` may not be read over http(s) (its name, or any address it resolves to, is refused), or None."""
    reason = literal_refusal(host, extra_networks)
    if reason is not None:
        return reason
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
        return None  # a literal address that passed
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except OSError:
        return None  # it does not resolve: the read names that
    for info in infos:
        address = info[4][0]
        if refused_address(address, extra_networks):
            return f"{host} resolves to {address}, a refused address (link-local, metadata service or --media-refuse)"
    return None


def canonical_url(url: str) -> str:
    """`url` in the form prefixes are compared in: a local path absolute and resolved (`..`, symlinks), a
    remote URL with its path normalised (`..` folded) and an http host lower-cased."""
    text = str(url).strip()
    if text.startswith("file://"):
        text = text[len("file://"):]
    if "://" not in text:
        return os.path.realpath(os.path.expanduser(text))
    protocol, _, rest = text.partition("://")
    protocol = protocol.lower()
    if protocol in HTTP_SCHEMES:
        parts = urlsplit(text)
        path = posixpath.normpath(parts.path) if parts.path else "/"
        netloc = parts.netloc.lower()
        query = f"?{parts.query}" if parts.query else ""
        return f"{protocol}://{netloc}{'' if path == '/' and not parts.path else path}{query}"
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/") if key else ""
    return f"{protocol}://{bucket}/{key}" if key else f"{protocol}://{bucket}"


def _inside(url: str, prefix: str) -> bool:
    if url == prefix:
        return True
    if "://" in prefix and prefix.split("://", 1)[1].count("/") == 0:  # a bare bucket or host: all of it
        return url.startswith(prefix + "/")
    return url.startswith(prefix.rstrip("/") + "/")


def hub_cache_dir() -> str:
    """The Hugging Face hub cache a hub id is read from (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def default_media_allow(manifest_url: str, extra=()) -> tuple[str, ...]:
    """The prefixes rows may read by default: the manifest's own directory (or bucket prefix) and the hub
    cache, then `extra` (the run's `--media-allow`)."""
    from genbatch.jobs.media import manifest_base

    return tuple(dict.fromkeys((manifest_base(manifest_url), hub_cache_dir(), *extra)))


@dataclass(frozen=True, kw_only=True, slots=True)
class MediaPolicy:
    """What a run's rows may read (see the module's docstring)."""

    allow: tuple[str, ...]
    """URL prefixes a row's media may lie under (as given; compared in `canonical_url` form)."""
    max_bytes: int = int(DEFAULT_MEDIA_MAX_MIB * 2**20)
    """The most bytes one input image may have (`--media-max-mib`)."""
    refuse: tuple = ()
    """Networks refused over http(s) besides `REFUSED_NETWORKS` (`--media-refuse`)."""

    @classmethod
    def for_manifest(cls, manifest_url: str, allow=(), max_mib: float = DEFAULT_MEDIA_MAX_MIB,
                     refuse=()) -> MediaPolicy:
        """The run's policy: the default prefixes of `manifest_url` plus `allow`."""
        return cls(allow=default_media_allow(manifest_url, allow), max_bytes=int(max_mib * 2**20),
                   refuse=_networks(refuse))

    @property
    def max_mib(self) -> float:
        return self.max_bytes / 2**20

    def _canonical_allow(self) -> tuple[str, ...]:
        return tuple(canonical_url(prefix) for prefix in self.allow)

    def outside(self, url: str) -> str | None:
        """Why `url` lies outside every allowed prefix (naming them and the flag), or None when inside one."""
        where = canonical_url(url)
        if any(_inside(where, prefix) for prefix in self._canonical_allow()):
            return None
        resolved = "" if where == url else f" (resolves to {where})"
        shown = ", ".join(self.allow)
        return (f"outside the allowed media prefixes{resolved}: {shown}; add --media-allow PREFIX to read "
                "from elsewhere")

    def refusal(self, url: str) -> str | None:
        """Why a rank may not read `url` (outside the prefixes, or a refused http(s) address), or None."""
        reason = self.outside(url)
        if reason is not None:
            return reason
        protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
        if protocol in HTTP_SCHEMES:
            parts = urlsplit(url)
            return host_refusal(parts.hostname or "", parts.port, self.refuse)
        return None

    def too_large(self, size: int | None) -> str | None:
        """Why a file of `size` bytes is not read (over `max_bytes`), or None."""
        if size is None or size <= self.max_bytes:
            return None
        return (f"is {size / 2**20:.1f} MiB, over the {self.max_mib:g} MiB a row's input may have; shrink it or "
                "raise --media-max-mib")
