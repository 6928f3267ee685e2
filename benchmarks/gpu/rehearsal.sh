#!/usr/bin/env bash
# The CPU rehearsal's set-up, called by `run.sh --rehearse` (one subcommand per step, each under its
# own timeout there). It builds what the GPU machine has: a bare Python with the image's packages
# (IMAGE_PACKAGES, torch as the CPU build) and nothing else, so the carried wheels are all the rest.
#
#   rehearsal.sh find-python X.Y             a working interpreter for CPython X.Y, or nothing
#   rehearsal.sh image VENV PYTHON TORCH     a venv with the image's packages (TORCH: a pinned spec or "")
#   rehearsal.sh carried-set VENV WHEELS     the carried wheels installed as on the GPU, then imports + pip check
set -euo pipefail
cd "$(dirname "$0")/../.."
# What the lent GPU image has besides torch (issue 14); torch comes as the CPU build in the rehearsal.
IMAGE_PACKAGES="nvidia-ml-py pillow httpx anyio h11 uvloop"
# The modules the GPU run needs from the carried wheels (plus adaptive_gate, which needs Starlette).
CARRIED_MODULES="fastapi starlette uvicorn multipart pydantic pydantic_core annotated_types typing_inspection"

find_python() {
    # pyenv's shims exist for versions that are not selected: try each candidate for real.
    local version=$1 candidate
    for candidate in "python$version" "$(pyenv root 2>/dev/null)/versions/$version"*/bin/"python$version"; do
        if "$candidate" -c 'import sys, venv' >/dev/null 2>&1; then
            command -v "$candidate" || echo "$candidate"
            return 0
        fi
    done
    return 0
}

image() {
    # A marker holds the package list: a venv built from another list is rebuilt, not reused.
    local venv=$1 python=$2 torch_spec=$3 wanted
    wanted="$("$python" -c 'import sys; print(sys.version.split()[0])') $torch_spec $IMAGE_PACKAGES"
    if [ -f "$venv/.image" ] && [ "$(cat "$venv/.image")" = "$wanted" ]; then
        echo "image venv $venv: reused ($wanted)"
        return 0
    fi
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # shellcheck disable=SC2086  # one argument per package
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $torch_spec $IMAGE_PACKAGES \
        2> >(grep -v "is ignored: it is neither" >&2)
    echo "$wanted" > "$venv/.image"
    echo "image venv $venv: built ($wanted)"
}

carried_set() {
    # Exactly the GPU machine's install (run.sh), into a fresh folder, then: do the modules import, and
    # does pip find every requirement of every distribution satisfied (a missing wheel fails here)?
    local venv=$1 wheels=$2
    site=$(mktemp -d) # global: the trap runs after the function has returned
    trap 'rm -rf "$site"' EXIT
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
        --target "$site" "$wheels"/*.whl
    PYTHONPATH="$site:$PWD" "$venv/bin/python" -c "
import importlib, sys
for name in '$CARRIED_MODULES adaptive_gate'.split():
    importlib.import_module(name)
print('carried set imports on', sys.version.split()[0])"
    PYTHONPATH="$site" "$venv/bin/python" -m pip check --disable-pip-version-check
}

case "${1:-}" in
    find-python) find_python "$2" ;;
    image) image "$2" "$3" "${4:-}" ;;
    carried-set) carried_set "$2" "$3" ;;
    *) echo "rehearsal.sh: unknown step ${1:-} (find-python, image, carried-set)" >&2; exit 2 ;;
esac
