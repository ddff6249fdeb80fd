"""A job's id names its files (`outputs/<id>.mp4`, its done marker), so it has a length bound."""

MAX_ID_BYTES = 200
"""Ids name files; file names stop at 255 bytes on most filesystems."""
