#!/usr/bin/env bash
# The GPU run: real NVML and torch.cuda probes, a real CUDA OOM through the gate, and the policies
# in front of the demo service on CUDA playing a 24 GiB card (--vram-fraction). At most 10 minutes.
#
#   bash benchmarks/gpu/run.sh            results under $OUT (default benchmarks/results/gpu/)
#
# The machine needs torch with CUDA, nvidia-ml-py, pillow, httpx, anyio and matplotlib (the lent
# H200 image has them) plus fastapi, starlette, uvicorn and python-multipart: where they cannot be
# installed from a registry, `bash benchmarks/gpu/fetch_wheels.sh` on a connected machine puts them
# in .whl/, and this script installs them from there.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

if ! "$PY" -c "import fastapi, uvicorn, multipart" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
    else
        "$PY" -m pip install -q fastapi uvicorn python-multipart
    fi
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"

"$PY" - <<'PYEOF' 2>&1 | tee "$OUT/checks.txt"
"""Checks that need the real card: probes, device mapping, a real OOM seen by is_oom and num_ooms."""
import json, os, sys, torch
from adaptive_gate import is_oom
from adaptive_gate.probes import CombinedProbe, NvmlProbe, TorchCudaProbe, auto_probe
if not torch.cuda.is_available():
    sys.exit("no CUDA device: this script is for the GPU machine")
report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
torch_probe = TorchCudaProbe(0)
nvml = NvmlProbe(torch_probe.uuid())
report["nvml_by_torch_uuid"] = repr(nvml)
probe, line = auto_probe()
report["auto_probe"] = line
before = CombinedProbe(nvml, torch_probe).sample()
held = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
del held  # freed to PyTorch's cache: NVML still counts it, the combined probe must not
after = CombinedProbe(nvml, torch_probe).sample()
report["cache_not_counted_bytes"] = after.used_bytes - before.used_bytes
report["nvml_used_with_cache"] = nvml.sample().used_bytes - before.used_bytes
ooms_before = torch_probe.allocator_stats()[2]
try:
    torch.empty(10 * 2**40, dtype=torch.uint8, device="cuda")
except Exception as exc:
    report["oom_type"] = type(exc).__name__
    report["is_oom"] = is_oom(exc)
report["num_ooms_delta"] = torch_probe.allocator_stats()[2] - ooms_before
print(json.dumps(report, indent=1))
assert report["is_oom"] and report["num_ooms_delta"] >= 1, report
assert abs(report["cache_not_counted_bytes"]) < 2**30, report
PYEOF

TOTAL_BYTES=$("$PY" -c "import torch; print(torch.cuda.get_device_properties(0).total_memory)")
FRACTION=$("$PY" -c "print(min(1.0, round(24 * 2**30 / $TOTAL_BYTES, 4)))")
echo "card: $TOTAL_BYTES bytes; playing a 24 GiB card with --vram-fraction $FRACTION" | tee -a "$OUT/checks.txt"
# 1024x1024 inputs: a few GiB per request, so that a handful fill 24 GiB as on a real service.
timeout 480 "$PY" -m benchmarks.http_demo --quick --device cuda --vram-fraction "$FRACTION" --image-side 1024 \
    --out "$OUT" 2>&1 | tee "$OUT/http_demo.txt"
