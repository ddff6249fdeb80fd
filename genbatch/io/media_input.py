"""Reading a row's input media: one image per URL, read once by the rank that runs the job.

`MediaReader.read(url)` first asks the run's media policy (`genbatch.io.media_policy`: the allowed prefixes,
the refused addresses, `--media-max-mib`) and reads nothing it refuses. It opens a path or object URL through
fsspec with the run's storage options (an http(s) URL through `genbatch.io.http_read`, every redirect checked),
every attempt under the run's retry policy (`--storage-timeout`), reads at most the policy's bound, decodes it
with Pillow and returns the RGB image with the sha256 of
its bytes (which the results row and the checkpoint's fingerprint carry). A missing file, a truncated or
undecodable one, or a file that is not an image raises `MediaError`, whose message names the URL and the
reason and never shows the file's bytes.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field

from genbatch.io.media_policy import HTTP_SCHEMES, MediaPolicy, MediaRefused, canonical_url
from genbatch.io.retry import RetryPolicy, StorageError, call_with_retries


class MediaError(ValueError):
    """A row's input media cannot be used: the message names the column, the URL and the reason."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MediaInput:
    """One decoded input image."""

    url: str
    """Where it was read from."""
    image: object
    """The image as a Pillow RGB image."""
    sha256: str
    """The sha256 of the file's bytes."""


@dataclass(kw_only=True, slots=True)
class MediaReader:
    """Reads input media through fsspec with the run's storage options and retry policy."""

    storage_options: dict = field(default_factory=dict)
    """fsspec options (endpoint, credentials, ...): the manifest's and the run's."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How long a failing read may keep failing before the job fails."""
    policy: MediaPolicy | None = None
    """What rows may read (None: anything, for callers that checked it themselves)."""

    def _bytes(self, url: str) -> bytes:
        import fsspec

        policy = self.policy or MediaPolicy(allow=("/",))
        if self.policy is not None:
            reason = self.policy.refusal(url)
            if reason is not None:
                raise MediaRefused(reason)
        protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
        if protocol in HTTP_SCHEMES:
            from genbatch.io.http_read import read_http

            def read() -> bytes:
                return read_http(url, policy, self.retry.timeout_s)
        else:
            where = canonical_url(url) if protocol == "file" else url  # what the policy judged is what is read

            def read() -> bytes:
                with fsspec.open(where, "rb", **self.storage_options) as handle:
                    reason = policy.too_large(getattr(handle, "size", None))
                    if reason is not None:
                        raise MediaRefused(reason)
                    data = handle.read(policy.max_bytes + 1)
                if len(data) > policy.max_bytes:
                    raise MediaRefused(policy.too_large(len(data)) or "too large")
                return data

        return call_with_retries(self.retry, "reading", url, read, passthrough=(FileNotFoundError, MediaRefused))

    def read(self, column: str, url: str) -> MediaInput:
        """The image at `url` (the row's `column`); MediaError naming the column, URL and reason."""
        from PIL import Image, UnidentifiedImageError

        try:
            data = self._bytes(url)
        except MediaRefused as refused:
            raise MediaError(f"column {column!r}: {url}: {refused}") from None
        except FileNotFoundError:
            raise MediaError(f"column {column!r}: {url}: no such file; check the path (a relative one is taken "
                             "from the manifest's directory)") from None
        except StorageError as error:
            raise MediaError(f"column {column!r}: {url}: cannot be read ({error}); check the URL and the "
                             "--storage-option credentials") from None
        except OSError as error:
            raise MediaError(f"column {column!r}: {url}: cannot be read ({type(error).__name__}); check the "
                             "path and its permissions") from None
        try:
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()  # decodes every pixel: a truncated file fails here, not later
                image = opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
            kind = "not an image" if isinstance(error, UnidentifiedImageError) else "a damaged image"
            raise MediaError(f"column {column!r}: {url}: {kind} (Pillow: {type(error).__name__}); give a PNG, "
                             "JPEG or WebP file") from None
        return MediaInput(url=url, image=image, sha256=hashlib.sha256(data).hexdigest())
