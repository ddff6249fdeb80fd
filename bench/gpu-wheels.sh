#!/usr/bin/env bash
# Wheels that bench/gpu.sh needs on a GPU machine that has PyTorch, transformers and pyarrow but no diffusers
# and cannot reach a package registry: diffusers (at the version this checkout's tests pass with) and its
# importlib_metadata, torchao (step 7's --quantization; its Python parts run on any recent torch), and
# imageio-ffmpeg with its ffmpeg binary (0.6.0: a 29 MB wheel, where 0.8's is 68 MB,
# over a 64 MiB transfer limit; genbatch needs >= 0.5). For CPython 3.12 on x86-64 Linux by default. Run it
# here, where pip works, and carry the folder: bench/gpu.sh installs from it with --no-index when the
# interpreter lacks those packages.
#
#   bash bench/gpu-wheels.sh            # -> .whl/ (git ignores it), about 36 MB
#   bash bench/gpu-wheels.sh DIR
#
# Environment: PYTHON (default .venv/bin/python when present, else python3): whose diffusers and
# importlib_metadata versions to pin; GENBATCH_WHEEL_PYTHON (default 3.12): the GPU machine's Python version.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
pins=("diffusers==$(version diffusers)" "importlib_metadata==$(version importlib_metadata)" "torchao==$(version torchao)"
      "imageio-ffmpeg==0.6.0")
mkdir -p "$dest"
echo "bench/gpu-wheels.sh: ${pins[*]} -> $dest" >&2
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GENBATCH_WHEEL_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$dest" "${pins[@]}"
ls -l "$dest" >&2
