"""`--size`: an output size by name (`720p`) or as `WIDTHxHEIGHT` (`1024x1024`), the one parser of `gen run`,
`gen validate` and `gen plan`.

The names are 16:9 landscape frames: 480p is 832x480 (the 480p of Wan 2.1, whose widths are multiples of 16;
the broadcast 854 is not), 540p 960x540, 720p 1280x720, 1080p 1920x1080. A model whose sizes must be multiples
of 16 refuses 540p's and 1080p's heights as it refuses any other, naming the nearest size it takes.
"""

from __future__ import annotations

import re

SIZE_NAMES: dict[str, tuple[int, int]] = {
    "480p": (832, 480),
    "540p": (960, 540),
    "720p": (1280, 720),
    "1080p": (1920, 1080),
}
"""The sizes `--size` takes by name, (width, height) in pixels."""

_PIXELS = re.compile(r"^([1-9][0-9]*)[x×]([1-9][0-9]*)$")

ACCEPTED = f"{', '.join(SIZE_NAMES)}, or WIDTHxHEIGHT in pixels (e.g. 1024x1024)"
"""The forms `--size` takes, for help texts and errors."""


def parse_frame_size(text: str) -> tuple[int, int]:
    """`720p` -> (1280, 720), `1024x768` -> (1024, 768); ValueError naming the accepted forms otherwise."""
    key = text.strip().lower()
    if key in SIZE_NAMES:
        return SIZE_NAMES[key]
    match = _PIXELS.match(key)
    if match is None:
        raise ValueError(f"--size {text!r} is not a size; give one of {ACCEPTED}")
    return int(match.group(1)), int(match.group(2))


def frame_size(size: str | None, width: int | None, height: int | None) -> tuple[int | None, int | None]:
    """The (width, height) that `--size` or `--width`/`--height` give (None where neither does); ValueError when
    `--size` comes with either of the others, which would leave two answers."""
    if size is None:
        return width, height
    parsed = parse_frame_size(size)
    given = [flag for flag, value in (("--width", width), ("--height", height)) if value is not None]
    if given:
        raise ValueError(f"--size {size} sets the width and the height; drop {' and '.join(given)} or --size "
                         f"(--size {size} is --width {parsed[0]} --height {parsed[1]})")
    return parsed
