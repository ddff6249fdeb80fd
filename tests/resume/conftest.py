"""Fixtures of the resume tests.

In-process runs use one intra-op thread, like each `gen run` worker the tests start (OMP_NUM_THREADS=1):
on a loaded 2-core machine two spinning OpenMP threads make the tiny models 30x slower, and outputs are
compared bit for bit with those of subprocess runs.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
