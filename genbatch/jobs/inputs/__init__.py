"""The per-row inputs a manifest row may bring, each declared once (`base.RowInput`) and listed here.

Adding one: its module in this package (its columns, its vectorised rule, how a null resolves, what a job
keeps of it, what the results and the checkpoint record, how a batch prepares it) and a line in `ROW_INPUTS`;
then the code that uses it (a family's hooks, the runner's preparation function its declaration names).
"""

from __future__ import annotations

from genbatch.jobs.inputs.audio import AUDIO
from genbatch.jobs.inputs.base import Checked, Column, InputBatch, RowInput, accepts
from genbatch.jobs.inputs.cache import CACHE
from genbatch.jobs.inputs.lora import LORA
from genbatch.jobs.inputs.media import MEDIA
from genbatch.jobs.inputs.num_outputs import NUM_OUTPUTS

ROW_INPUTS: tuple[RowInput, ...] = (CACHE, MEDIA, AUDIO, LORA, NUM_OUTPUTS)
"""Every per-row input, in the order the job table's columns and a row's problems list them."""

__all__ = ["ROW_INPUTS", "Checked", "Column", "InputBatch", "RowInput", "accepts"]
