"""Stage names in timings and results that changed, and how a run written before reads today.

`compress` is the stage that turns a job's decoded frames into its output file's bytes (PNG's deflate, the
H.264 video with its sound track) before `write` stores them. It was called `encode_media`, which read like
one more model stage beside `text_encode` and `vae_encode`; timings and results written under that name are
read under the new one (`RunStore.read_timings`, the report's stage columns, `gen bench` baselines).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

COMPRESS = "compress"
"""The stage that compresses a job's frames into its output file's bytes (PNG, MP4), before `write`."""

RENAMED: dict[str, str] = {"encode_media": COMPRESS}
"""Old stage name -> today's, for runs written before the rename."""


def current_stage(name: str) -> str:
    """Today's name of a stage a run wrote (an old name's new one; any other as it is)."""
    return RENAMED.get(name, name)


def with_current_stages(timings: pa.Table) -> pa.Table:
    """A timings table whose `stage` column says today's names (unchanged when no old name is in it)."""
    if "stage" not in timings.column_names or timings.num_rows == 0:
        return timings
    column = timings.column("stage")
    if not pc.any(pc.is_in(column, value_set=pa.array(list(RENAMED), type=column.type))).as_py():
        return timings
    renamed = pa.array([current_stage(name) if name is not None else None for name in column.to_pylist()],
                       type=column.type)
    return timings.set_column(timings.column_names.index("stage"), "stage", renamed)
