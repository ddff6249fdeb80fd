#!/usr/bin/env bash
# Object-storage tests against a real Ceph RGW on loopback: start it (installing the Debian packages when
# missing), run every test marked `ceph`, stop it again whatever happens.
#   bash .ci/ceph.sh [PYTHON]        PYTHON defaults to .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
trap 'scripts/ceph-rgw stop' EXIT
eval "$(scripts/ceph-rgw start)"
"$PYTHON" -m pytest tests -m ceph -q
