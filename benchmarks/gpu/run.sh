#!/usr/bin/env bash
# The GPU run: real NVML and torch.cuda probes, the demo model's real memory per request, the demo on
# CUDA behind the gate through a real OOM, and the policies (none, a static sweep, adaptive) at a load
# that saturates the card, on a fraction of it sized so that about five requests fit.
#
#   bash benchmarks/gpu/fetch_wheels.sh        first, on a machine with an index: the pinned wheel set
#                                              (benchmarks/gpu/wheels.txt, CPython 3.12, ~3 MiB) in .whl/
#   bash benchmarks/gpu/run.sh                 on the GPU machine: carry [".whl"], give it 540 s; results
#                                              under $OUT (default benchmarks/results/gpu/)
#   bash benchmarks/gpu/run.sh --rehearse      the same steps on the CPU (SimulatedGPU) in a clean venv
#                                              built from the same pins plus the GPU image's packages;
#                                              results under $OUT (default .rehearsal/out/)
#
# The GPU image has torch (CUDA), nvidia-ml-py, pillow, httpx, anyio, h11 and uvloop, and no index:
# everything else comes from the carried wheels. Each step runs under its own timeout, within a budget
# of 450 s for the whole run; a failed step is recorded in steps.tsv and the next one still runs. At
# most 7 files under $OUT: run.log, steps.tsv, env.json, probes.json, sizing.json, demo.json, http_demo.json.
set -uo pipefail # no -e: a failed step must not stop the ones after it
cd "$(dirname "$0")/../.."
ROOT=$PWD
REHEARSE=0
case "${1:-}" in
    --rehearse) REHEARSE=1 ;;
    "") ;;
    *) echo "usage: bash benchmarks/gpu/run.sh [--rehearse]" >&2; exit 2 ;;
esac
BUDGET_S=${GPU_RUN_BUDGET_S:-450}
if [ "$REHEARSE" = 1 ]; then OUT=${OUT:-$ROOT/.rehearsal/out}; else OUT=${OUT:-$ROOT/benchmarks/results/gpu}; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/steps.tsv"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
# Read once, when torch sets CUDA up: in the environment before any Python starts.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
FAILED=0
STARTED=$SECONDS

step() { # step NAME SECONDS COMMAND...: COMMAND under its own timeout, cut to what is left of the budget
    local name=$1 limit=$2 left began rc
    shift 2
    left=$((BUDGET_S - (SECONDS - STARTED)))
    if [ "$left" -lt 15 ]; then
        echo "== $name: skipped, the budget of $BUDGET_S s is spent"
        printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
        FAILED=1
        return 1
    fi
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    echo "== $name (at most $limit s, $((SECONDS - STARTED)) s in)"
    began=$SECONDS
    timeout -k 5 "$limit" "$@"
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - began))" >>"$OUT/steps.tsv"
    echo "== $name: exit $rc after $((SECONDS - began)) s"
    if [ "$rc" != 0 ]; then FAILED=1; fi
    return "$rc"
}

if [ "$REHEARSE" = 1 ]; then
    # The set-up is not part of the GPU run: its own clock.
    BUDGET_S=$((BUDGET_S + 300))
    R=$ROOT/.rehearsal
    PYTHON_VERSION=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    step wheels-3.12 60 bash benchmarks/gpu/fetch_wheels.sh # exactly what the GPU run carries: .whl/
    PY312=$(bash benchmarks/gpu/rehearsal.sh find-python 3.12)
    if [ -n "$PY312" ]; then
        # No torch for 3.12 here: the carried set is proven on 3.12 with the image's other packages.
        step image-3.12 120 bash benchmarks/gpu/rehearsal.sh image "$R/image-3.12" "$PY312" ""
        step carried-set-3.12 60 bash benchmarks/gpu/rehearsal.sh carried-set "$R/image-3.12" .whl
    else
        echo "== no CPython 3.12 here: the carried set is proven with its $PYTHON_VERSION build below"
    fi
    # The full run needs torch, whose CPU build (torch==2.13.0) lies on disk for this machine's python3.
    WHEELS=.whl
    if [ "$PYTHON_VERSION" != 3.12 ]; then
        WHEELS=$R/whl-$PYTHON_VERSION # the same pins; only pydantic-core's binary differs
        step wheels-"$PYTHON_VERSION" 60 bash benchmarks/gpu/fetch_wheels.sh --python "$PYTHON_VERSION" --dest "$WHEELS"
    fi
    step image-"$PYTHON_VERSION" 240 bash benchmarks/gpu/rehearsal.sh image "$R/image-$PYTHON_VERSION" python3 "torch==${REHEARSAL_TORCH:-2.13.0}"
    PY=$R/image-$PYTHON_VERSION/bin/python
    DEVICE=cpu MODEL=resnet-tiny SIDE=96 BURST=16 FALLBACK_CARD="--simulated-vram 768MiB" TWIN=--rehearse
    HTTP_ARGS=(--policies none,adaptive,static:5 --duration-s 3 --deadline-s 3 --capacity-s 2)
else
    PY=${PYTHON:-python3}
    PYTHON_VERSION=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    WHEELS=.whl
    DEVICE=cuda MODEL=resnet50 SIDE=1024 BURST=16 FALLBACK_CARD="--vram-fraction 0.01" TWIN=
    HTTP_ARGS=(--policies none,adaptive,static:5,static:8,static:3 --duration-s 12 --capacity-s 5)
fi

# The carried wheels, installed beside the image's packages (there is no index on the GPU machine).
SITE=$(mktemp -d "${TMPDIR:-/tmp}/adaptive-gate-site.XXXXXX")
if ! step wheel-set 15 "$PY" benchmarks/gpu/wheelset.py check "$WHEELS" --python "$PYTHON_VERSION"; then
    echo "   (carry .whl: run bash benchmarks/gpu/fetch_wheels.sh on a machine with an index first)"
fi
step install 60 "$PY" benchmarks/gpu/wheelset.py install "$WHEELS" "$SITE" # pip --no-index --no-deps --target
export PYTHONPATH="$ROOT:$SITE"

step env 30 "$PY" -m benchmarks.gpu.steps env --out "$OUT"
# shellcheck disable=SC2086  # TWIN is --rehearse or nothing
step probes 60 "$PY" -m benchmarks.gpu.steps probes --out "$OUT" $TWIN
# shellcheck disable=SC2086
step sizing 90 "$PY" -m benchmarks.gpu.steps sizing --out "$OUT" --model "$MODEL" --image-side "$SIDE" $TWIN
CARD=$("$PY" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["demo_args"]))' "$OUT/sizing.json" 2>/dev/null) ||
    CARD=$FALLBACK_CARD
echo "== the card for the demo: $CARD"
DEMO=(--device "$DEVICE" --model "$MODEL" --image-side "$SIDE")
step demo 90 "$PY" -m benchmarks.gpu.steps demo --out "$OUT" --burst "$BURST" --demo-args "${DEMO[*]} $CARD"
LEFT=$((BUDGET_S - (SECONDS - STARTED)))
# shellcheck disable=SC2086  # CARD is two words: a flag and its value
step http_demo "$LEFT" "$PY" -m benchmarks.http_demo "${DEMO[@]}" $CARD --scenarios classic \
    --capacity-policy static:5 "${HTTP_ARGS[@]}" --budget-s $((LEFT - 20)) --out "$OUT"

rm -rf "$SITE"
echo "== done in $((SECONDS - STARTED)) s; steps (name, exit status, seconds):"
cat "$OUT/steps.tsv"
exit "$FAILED"
