#!/usr/bin/env bash
# On a machine with a package index: download the pinned wheel set (benchmarks/gpu/wheels.txt) that
# benchmarks/gpu/run.sh installs on the GPU machine, then check it: one wheel per pin, for that Python,
# under 64 MiB. The folder is emptied first, so no stale second version can ride along.
#
#   bash benchmarks/gpu/fetch_wheels.sh                                  CPython 3.12 (the GPU image) into .whl/
#   bash benchmarks/gpu/fetch_wheels.sh --python 3.11 --dest DIR         another Python (the CPU rehearsal)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON_VERSION=3.12
DEST=.whl
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PYTHON_VERSION="$2"; shift 2 ;;
        --dest) DEST="$2"; shift 2 ;;
        *) echo "fetch_wheels.sh: unknown argument $1 (use --python X.Y, --dest DIR)" >&2; exit 2 ;;
    esac
done
ABI="cp${PYTHON_VERSION/./}"
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
# shellcheck disable=SC2046  # one argument per pin
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYTHON_VERSION" --implementation cp --abi "$ABI" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DEST" $(python3 benchmarks/gpu/wheelset.py pins) 2> >(grep -v "is ignored: it is neither" >&2)
python3 benchmarks/gpu/wheelset.py check "$DEST" --python "$PYTHON_VERSION"
