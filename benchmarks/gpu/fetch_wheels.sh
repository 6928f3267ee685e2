#!/usr/bin/env bash
# On a machine with a package registry: fetch the wheels benchmarks/gpu/run.sh needs and the lent
# GPU image lacks, for CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
for spec in fastapi starlette uvicorn python-multipart pydantic pydantic-core annotated-types typing-inspection; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "$spec"
done
ls .whl
