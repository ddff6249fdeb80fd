"""genbatch.io: the run store (atomic outputs, done markers, checkpoints, timings, results) on any fsspec URL,
media encoding, retries for object stores, and the background writer."""

from genbatch.io.media import decode_mp4, decode_png, encode_mp4, encode_png
from genbatch.io.options import parse_storage_options
from genbatch.io.retry import RetryPolicy, StorageError, is_transient
from genbatch.io.store import CommitResult, RunStore, new_attempt_id
from genbatch.io.writer import BackgroundWriter

__all__ = [
    "BackgroundWriter",
    "CommitResult",
    "RetryPolicy",
    "RunStore",
    "StorageError",
    "decode_mp4",
    "decode_png",
    "encode_mp4",
    "encode_png",
    "is_transient",
    "new_attempt_id",
    "parse_storage_options",
]
