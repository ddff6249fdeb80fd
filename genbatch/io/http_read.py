"""Reading one http(s) URL a row names, under the run's media policy: every hop checked, the size bounded.

    data = read_http(url, policy, timeout_s=120)

Redirects are followed by hand, at most `MAX_REDIRECTS`, and each target is judged by the policy again (its
prefix, its host and every address that host resolves to: `MediaPolicy.refusal`) before any byte is sent to
it; so an allowed URL that redirects to the metadata service is refused without a request to it. The body is
read up to the policy's `max_bytes` and no further: a larger `Content-Length`, or a stream that keeps going,
raises `MediaRefused`. A failed request raises `OSError` with the status (never the body).
"""

from __future__ import annotations

import http.client
import ssl
from urllib.parse import urljoin, urlsplit

from genbatch.io.media_policy import MediaPolicy, MediaRefused

MAX_REDIRECTS = 5
_CHUNK = 1 << 16


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s,
                                           context=ssl.create_default_context()), target
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s), target


def _body(response: http.client.HTTPResponse, url: str, policy: MediaPolicy) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit():
        reason = policy.too_large(int(declared))
        if reason is not None:
            raise MediaRefused(f"{url}: {reason}")
    chunks, size = [], 0
    while True:
        chunk = response.read(min(_CHUNK, policy.max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > policy.max_bytes:
            raise MediaRefused(f"{url}: sends more than the {policy.max_mib:g} MiB a row's input may have; shrink "
                               "it or raise --media-max-mib")


def read_http(url: str, policy: MediaPolicy, timeout_s: float, body=None):
    """The body of `url`, every redirect hop judged by `policy`; MediaRefused, FileNotFoundError (404/410) or
    OSError naming the URL and the status. `body(response, declared_size)`: reads the final response instead
    of the policy's size-bounded read (an adapter is bounded by its own header, `genbatch.io.adapter_file`)."""
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        reason = policy.refusal(current)
        if reason is not None:
            via = "" if current == url else f" (redirected to {current})"
            raise MediaRefused(f"{url}{via}: {reason}")
        connection, target = _connection(current, timeout_s)
        try:
            connection.request("GET", target, headers={"User-Agent": "genbatch", "Accept-Encoding": "identity"})
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                if not location:
                    raise OSError(f"HTTP {response.status} without a Location")
                current = urljoin(current, location)
                continue
            if response.status in (404, 410):
                raise FileNotFoundError(current)
            if response.status != 200:
                raise OSError(f"HTTP {response.status} {response.reason}")
            if body is not None:
                declared = response.getheader("Content-Length")
                return body(response, int(declared) if declared and declared.strip().isdigit() else None)
            return _body(response, url, policy)
        finally:
            connection.close()
    raise OSError(f"more than {MAX_REDIRECTS} redirects")
