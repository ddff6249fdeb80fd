"""The local Slurm cluster for the tests marked `slurm`: started once per session, stopped by PID at the end.

Tests skip only when the cluster cannot exist here (not root, or apt cannot install slurm-wlm and munge),
with the reason. Jobs run `python -m genbatch...` from this checkout's virtualenv.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.support.slurm_cluster import SlurmCluster, ensure_hostnames, ensure_installed


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = ensure_installed()
    if reason:
        pytest.skip(reason)
    ensure_hostnames()
    root = tempfile.mkdtemp(prefix="genbatch-slurm-")
    cluster = SlurmCluster.start(root)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
