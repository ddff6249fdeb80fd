"""Debian packages a test needs, installed with apt-get when missing (as CI's clean machine has none of them).

    reason = apt_install(("slurm-wlm", "munge"))    None when installed, else why not (a skip reason)
"""

from __future__ import annotations

import os
import shutil
import subprocess


def apt_install(packages: tuple[str, ...], timeout_s: float = 600.0) -> str | None:
    """Install `packages` with apt-get (refreshing the package lists once if the first try fails); None when it
    worked, else why not: no apt-get, not root, or apt-get's own error."""
    if not shutil.which("apt-get"):
        return f"{' and '.join(packages)} are missing and this machine has no apt-get to install them"
    if os.geteuid() != 0:
        return f"{' and '.join(packages)} are missing and installing them with apt-get needs root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:  # stale package lists: refresh once and retry
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=timeout_s)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        return f"apt-get could not install {' '.join(packages)}: {result.stderr.strip()[-500:]}"
    return None
