"""Reading one adapter file a row names: safetensors only, bounded by what its own header declares.

    adapter = read_adapter(url, policy=policy, storage_options=options, timeout_s=120)
    adapter.tensors, adapter.metadata, adapter.sha256

A safetensors file is 8 bytes of header length (little-endian u64), a JSON header naming each tensor's dtype,
shape and byte range, then the data. The reader checks the header before any data is read: its length (at
most `MAX_HEADER_BYTES`), every tensor's range against its dtype and shape, the ranges tiling the data, and the
data's size (at most `MAX_ADAPTER_BYTES`) against the file's listed size; then it reads exactly that many bytes
and no more. So a row naming a 50 GB object or an endless stream costs the header. Nothing is unpickled: a
pickle format (`.bin`, `.pt`, a zip or pickle stream under another name) is refused with the fix, and errors
name the URL and the reason, never the bytes. (A pickle file name is refused before this, by the row's check:
`genbatch.jobs.lora.pickle_problem`.)
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from genbatch.io.media_policy import HTTP_SCHEMES, MediaPolicy, MediaRefused, canonical_url

MAX_HEADER_BYTES = 100 << 20
"""The longest header read (safetensors' own limit)."""
MAX_ADAPTER_BYTES = 16 << 30
"""The most tensor data one adapter may declare."""

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
TO_SAFETENSORS = "convert it to safetensors (safetensors.torch.save_file) and name that file"
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class AdapterError(ValueError):
    """An adapter that cannot be loaded: the message names the URL, the reason and the fix."""


@dataclass(frozen=True, slots=True)
class AdapterFile:
    """One adapter file, read and checked."""

    url: str
    """Where it was read from."""
    sha256: str
    """The file's sha256 (header and data)."""
    tensors: dict
    """Name -> tensor, as the file stores them."""
    metadata: dict
    """The header's `__metadata__` (strings; e.g. the `lora_adapter_metadata` diffusers writes), or {}."""


@dataclass(frozen=True, slots=True)
class _Header:
    length: int
    metadata: dict
    data_bytes: int


def _header(prefix: bytes, read, url: str) -> _Header:
    """The checked header, given its first 8 bytes and `read(n)` for the rest."""
    (length,) = struct.unpack("<Q", prefix[:8])
    if not 2 <= length <= MAX_HEADER_BYTES:  # a header length of 0x0280 starts b"\x80\x02" too: judge it first
        if prefix.startswith(_PICKLE_MAGIC):
            raise AdapterError(f"{url}: not a safetensors file (it looks like a pickle or zip archive); "
                               f"{TO_SAFETENSORS}")
        raise AdapterError(f"{url}: not a safetensors file (a header of {length} bytes); {TO_SAFETENSORS}")
    raw = read(length)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except ValueError:
        raise AdapterError(f"{url}: not a safetensors file (its header is not JSON); {TO_SAFETENSORS}") from None
    metadata = header.pop("__metadata__", None) or {}
    ranges = []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            count = 1
            for dim in shape:
                count *= int(dim)
            declared = count * _DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise AdapterError(f"{url}: tensor {name!r} has a malformed header entry; re-save the adapter with "
                               "safetensors") from None
        if end - begin != declared or begin < 0:
            raise AdapterError(f"{url}: tensor {name!r} declares {declared} bytes ({dtype} {shape}) but spans "
                               f"{end - begin}; re-save the adapter with safetensors")
        ranges.append((begin, end))
    ranges.sort()
    position = 0
    for begin, end in ranges:
        if begin != position:
            raise AdapterError(f"{url}: the tensors' byte ranges overlap or leave gaps; re-save the adapter with "
                               "safetensors")
        position = end
    if position > MAX_ADAPTER_BYTES:
        raise AdapterError(f"{url}: declares {position / 2**30:.1f} GiB of tensors, more than the "
                           f"{MAX_ADAPTER_BYTES >> 30} GiB an adapter may have")
    return _Header(length=length, metadata=dict(metadata), data_bytes=position)


def _read_exactly(read, count: int, url: str) -> bytes:
    chunks, left = [], count
    while left:
        chunk = read(min(left, 1 << 24))
        if not chunk:
            raise AdapterError(f"{url}: ends {left} bytes before the data its header declares; the file is "
                               "truncated, copy it again")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _load(url: str, prefix: bytes, header: _Header, header_bytes: bytes, data: bytes) -> AdapterFile:
    from safetensors.torch import load

    blob = prefix + header_bytes + data
    return AdapterFile(url=url, sha256=hashlib.sha256(blob).hexdigest(), tensors=load(blob), metadata=header.metadata)


def _read_stream(read, url: str, size: int | None) -> AdapterFile:
    if size is not None and size < 8:
        raise AdapterError(f"{url}: {size} bytes is not a safetensors file; {TO_SAFETENSORS}")
    prefix = _read_exactly(read, 8, url)
    kept: list[bytes] = []

    def read_header(count: int) -> bytes:
        kept.append(_read_exactly(read, count, url))
        return kept[-1]

    header = _header(prefix, read_header, url)
    whole = 8 + header.length + header.data_bytes
    if size is not None and size != whole:
        raise AdapterError(f"{url}: is {size} bytes, but its header declares {whole}; copy it again or re-save it")
    return _load(url, prefix, header, kept[0], _read_exactly(read, header.data_bytes, url))


def read_adapter(url: str, *, policy: MediaPolicy | None, storage_options: dict | None = None,
                 timeout_s: float = 120.0) -> AdapterFile:
    """The adapter at `url` (a .safetensors file), read under the run's media policy (its prefixes and, for
    http(s), its address rules and redirect checks); AdapterError naming the URL, the reason and the fix."""
    if policy is not None:
        reason = policy.refusal(url)
        if reason is not None:
            raise AdapterError(f"{url}: {reason}")
    from genbatch.io.retry import RetryPolicy, call_with_retries

    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in HTTP_SCHEMES:
        from genbatch.io.http_read import read_http

        def read() -> AdapterFile:
            return read_http(url, policy or MediaPolicy(allow=("/",)), timeout_s,
                             body=lambda response, size: _read_stream(response.read, url, size))
    else:
        import fsspec

        where = canonical_url(url) if protocol == "file" else url  # what the policy judged is what is read

        def read() -> AdapterFile:
            with fsspec.open(where, "rb", **(storage_options or {})) as handle:
                return _read_stream(handle.read, url, getattr(handle, "size", None))
    try:  # transient storage errors retried for at most --storage-timeout, as every read of the run
        return call_with_retries(RetryPolicy(timeout_s=timeout_s), "reading", url, read,
                                 passthrough=(FileNotFoundError, IsADirectoryError, MediaRefused, AdapterError))
    except MediaRefused as refused:
        raise AdapterError(f"{url}: {refused}") from None
    except FileNotFoundError:
        raise AdapterError(f"{url}: no such file; check the path, or copy the adapter there") from None
    except IsADirectoryError:
        raise AdapterError(f"{url}: is a directory; name the .safetensors file in it (weight_name)") from None
