"""Standard streams that outlive their reader: a rank whose launcher (or terminal, or CI log runner) is gone
writes into a pipe nobody reads any more, and every `print` would raise `BrokenPipeError`: in a job that
would fail the job, in a stop it would keep the process from reaching its exit.

    with dropped_when_dead():      # sys.stdout and sys.stderr drop what they cannot write
        ...                        # a closed or broken pipe is silence, not an exception

The wrappers delegate everything else (`fileno`, `isatty`, `encoding`, ...) to the streams they wrap, so
tqdm, logging and click keep working; they are put back on the way out. (This module imports nothing heavy:
`gen run` installs it before its heavy imports.)
"""

from __future__ import annotations

import contextlib
import sys

_DEAD_ERRORS = (OSError, ValueError)
"""What writing to a gone reader raises: BrokenPipeError and other OSErrors; ValueError for a closed file."""


class DroppingStream:
    """A text stream that, once a write or flush has failed, drops everything written to it."""

    def __init__(self, stream):
        self._stream = stream
        self.dead = False
        """True once the stream has failed: nothing more is tried (its buffer would fail the same way)."""

    def write(self, text: str) -> int:
        if not self.dead:
            try:
                return self._stream.write(text)
            except _DEAD_ERRORS:
                self.dead = True
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.dead:
            try:
                self._stream.flush()
            except _DEAD_ERRORS:
                self.dead = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def say(text: str) -> None:
    """`text` as one line on stderr, flushed; nothing when stderr is closed or broken (whichever stream
    sys.stderr is)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except _DEAD_ERRORS:
        pass


@contextlib.contextmanager
def dropped_when_dead():
    """Within the block sys.stdout and sys.stderr are `DroppingStream`s over what they were (nested uses
    wrap once)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (stream if isinstance(stream, DroppingStream) or stream is None else DroppingStream(stream)
                              for stream in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
