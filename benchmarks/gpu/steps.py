"""The GPU run's steps, one subcommand each; each writes one JSON document under --out and exits 1
when one of its checks failed, after writing what it saw.

    python -m benchmarks.gpu.steps env     --out DIR                 versions, driver, card, MIG mode
    python -m benchmarks.gpu.steps probes  --out DIR                 NVML, torch.cuda, a real OOM
    python -m benchmarks.gpu.steps sizing  --out DIR --model M --image-side S
    python -m benchmarks.gpu.steps demo    --out DIR --model M --image-side S --demo-args "..."

Where CUDA is absent (the CPU rehearsal, `run.sh --rehearse`) each step runs its twin on a
`SimulatedGPU`: the same code paths around the card, so the script is exercised end to end on
every CI run and cannot rot before a GPU is lent.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20
FIT_REQUESTS = 5  # the card is sized so that about this many requests fit at once
OVERSIZE_BATCH = 8  # images in one request: more than the card holds
DISTRIBUTIONS = (
    "torch", "nvidia-ml-py", "pillow", "httpx", "anyio", "h11", "uvloop", "fastapi", "starlette", "uvicorn",
    "python-multipart", "pydantic", "pydantic-core", "typing-extensions", "click", "opentelemetry-api",
)  # fmt: skip


def write(out: Path, name: str, document: dict[str, Any]) -> int:
    """Write `name`.json and print it; 0 when every check passed (or there are none), else 1."""
    out.mkdir(parents=True, exist_ok=True)
    checks: dict[str, bool] = document.get("checks", {})
    document["ok"] = all(checks.values())
    text = json.dumps(document, indent=1, default=str)
    (out / f"{name}.json").write_text(text + "\n")
    print(text, flush=True)
    failed = [check for check, passed in checks.items() if not passed]
    if failed:
        print(f"{name}: failed checks: {', '.join(failed)}", file=sys.stderr)
    return 0 if document["ok"] else 1


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# --- env -------------------------------------------------------------------------------------------


def command_output(command: list[str]) -> str:
    """A command's output, or why there is none (no nvidia-smi on a CPU machine)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return (done.stdout + done.stderr).strip()


def environment() -> dict[str, Any]:
    import torch

    document: dict[str, Any] = {
        "python": sys.version,
        "platform": platform.platform(),
        "versions": {name: installed_version(name) for name in DISTRIBUTIONS},
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "variables": {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")},
        "nvidia_smi_list": command_output(["nvidia-smi", "-L"]),
        "nvidia_smi": command_output(
            [
                "nvidia-smi",
                "--format=csv",
                "--query-gpu=index,name,uuid,driver_version,memory.total,memory.used,"
                "memory.reserved,mig.mode.current,compute_mode",
            ]
        ),  # fmt: skip
    }
    if torch.cuda.is_available():
        document["devices"] = [
            {"name": p.name, "uuid": str(p.uuid), "total_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}"}
            for p in (torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count()))
        ]
    document["checks"] = {"demo_imports": imports_ok(document)}
    return document


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def imports_ok(document: dict[str, Any]) -> bool:
    """The carried wheels and the image's packages import together (the demo needs all of them)."""
    for module in ("fastapi", "uvicorn", "multipart", "pydantic", "adaptive_gate", "demo_service"):
        try:
            importlib.import_module(module)
        except Exception as exc:
            document["import_error"] = f"{module}: {exc!r}"
            return False
    return True


# --- probes ----------------------------------------------------------------------------------------


def probes_on_cuda() -> dict[str, Any]:
    """The real probes: NVML by torch's UUID, the cache left out, a real OOM seen twice."""
    import pynvml
    import torch

    from adaptive_gate import is_oom
    from adaptive_gate.probes import CombinedProbe, NvmlProbe, TorchCudaProbe, auto_probe

    # The context first: reading "before" without it would measure the context (~0.5 GiB), not the cache.
    torch.cuda.init()
    torch.ones(1, device="cuda:0")
    torch.cuda.synchronize()
    torch_probe = TorchCudaProbe(0)
    nvml = NvmlProbe(torch_probe.uuid())
    handle = pynvml.nvmlDeviceGetHandleByUUID(nvml.uuid)
    free, total = torch.cuda.mem_get_info(0)
    doc: dict[str, Any] = {
        "torch_uuid": torch_probe.uuid(),
        "nvml": repr(nvml),
        "auto_probe": auto_probe()[1],
        "nvml_v1": nvml_reading(pynvml, handle, None),
        "nvml_v2": nvml_reading(pynvml, handle, getattr(pynvml, "nvmlMemory_v2", None)),
        "nvml_probe_memory_info": nvml.memory_info(),
        "mem_get_info": {"free": free, "total": total, "used": total - free},
    }
    combined = CombinedProbe(nvml, torch_probe)
    before, nvml_before = combined.sample(), nvml.sample()
    held = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda:0")
    holding = combined.sample()
    del held  # back to PyTorch's cache: NVML still counts it, the combined probe must not
    after, nvml_after = combined.sample(), nvml.sample()
    doc["held_seen_bytes"] = holding.used_bytes - before.used_bytes
    doc["cache_counted_bytes"] = after.used_bytes - before.used_bytes
    doc["nvml_with_cache_bytes"] = nvml_after.used_bytes - nvml_before.used_bytes
    ooms_before = torch_probe.allocator_stats()[2]
    doc.update(real_oom(lambda: torch.empty(10 * 2**40, dtype=torch.uint8, device="cuda:0"), is_oom))
    doc["num_ooms_delta"] = torch_probe.allocator_stats()[2] - ooms_before
    doc["checks"] = {
        "nvml_found_by_torch_uuid": nvml.uuid.endswith(torch_probe.uuid()),
        "held_4gib_seen": doc["held_seen_bytes"] >= 3.5 * GiB,
        "cache_not_counted": abs(doc["cache_counted_bytes"]) < 256 * MiB,
        "oom_recognised": doc["is_oom"],
        "oom_counted_in_num_ooms": doc["num_ooms_delta"] >= 1,
    }
    return doc


def nvml_reading(pynvml: Any, handle: Any, version: int | None) -> dict[str, Any]:
    """One raw NVML memory reading (v1, or v2 with the driver's reserve apart)."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, **({"version": version} if version else {}))
    except Exception as exc:
        return {"error": repr(exc)}
    return {name: int(getattr(info, name)) for name in ("total", "used", "free", "reserved") if hasattr(info, name)}


def real_oom(allocate: Callable[[], object], is_oom: Callable[[BaseException], bool]) -> dict[str, Any]:
    """Provoke an OOM and keep only its description: a held exception pins its frames' memory."""
    try:
        allocate()
    except Exception as exc:
        return {"oom_type": type(exc).__name__, "is_oom": is_oom(exc), "oom_message": str(exc)[:200]}
    return {"oom_type": None, "is_oom": False}


def probes_simulated() -> dict[str, Any]:
    """The same checks on a SimulatedGPU: what the probes step reads where there is no card."""
    from adaptive_gate import is_oom
    from adaptive_gate.probes import auto_probe
    from adaptive_gate.testing import SimulatedGPU

    gpu = SimulatedGPU(8 * GiB)
    before = gpu.sample()
    with gpu.allocate(4 * GiB):
        holding = gpu.sample()
    after = gpu.sample()
    doc: dict[str, Any] = {"simulated": True, "auto_probe": auto_probe()[1]}
    doc["held_seen_bytes"] = holding.used_bytes - before.used_bytes
    doc["cache_counted_bytes"] = after.used_bytes - before.used_bytes

    def too_much() -> None:
        with gpu.allocate(10 * 2**40):
            pass

    doc.update(real_oom(too_much, is_oom))
    doc["num_ooms_delta"] = (gpu.sample().oom_count or 0) - (before.oom_count or 0)
    doc["checks"] = {
        "held_4gib_seen": doc["held_seen_bytes"] == 4 * GiB,
        "cache_not_counted": doc["cache_counted_bytes"] == 0,
        "oom_recognised": doc["is_oom"],
        "oom_counted_in_num_ooms": doc["num_ooms_delta"] == 1,
    }
    return doc


# --- sizing ----------------------------------------------------------------------------------------


def choose_fraction(weights_bytes: int, request_bytes: int, total_bytes: int, fit: int = FIT_REQUESTS) -> float:
    """The share of the card that holds the weights and `fit` requests at their peak, not `fit + 1`.

    Half a request of room on top of `fit`: allocations interleave and the cache fragments, so
    exactly `fit` would leave the fifth on the edge. Rounded up to 4 decimals.
    """
    if min(weights_bytes, request_bytes) < 0 or request_bytes == 0 or total_bytes <= 0 or fit < 1:
        raise ValueError(f"cannot size a card from weights={weights_bytes} request={request_bytes} total={total_bytes}")
    needed = weights_bytes + (fit + 0.5) * request_bytes
    if needed > total_bytes:
        raise ValueError(f"{fit} requests of {request_bytes} bytes and {weights_bytes} bytes of weights "
                         f"do not fit in {total_bytes} bytes")  # fmt: skip
    return math.ceil(needed / total_bytes * 10_000) / 10_000


def sizing_on_cuda(architecture: str, side: int) -> dict[str, Any]:
    """The demo model's real peak per image (`max_memory_allocated`), and the fraction that fits five."""
    import torch

    from demo_service.model import build_model

    device = torch.device("cuda:0")
    model = build_model(architecture, num_classes=1000, seed=0, weights=None).to(device)
    weights_bytes = torch.cuda.memory_allocated(device)
    forward(model, torch.zeros(1, 3, side, side), device)  # warm-up: kernels load, cuDNN picks its algorithms
    base_bytes = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    forward(model, torch.zeros(1, 3, side, side), device)
    request_bytes = torch.cuda.max_memory_allocated(device) - base_bytes
    total_bytes = torch.cuda.get_device_properties(device).total_memory
    fraction = choose_fraction(weights_bytes, request_bytes, total_bytes)
    doc: dict[str, Any] = {
        "model": architecture, "image_side": side, "weights_bytes": weights_bytes,
        "request_peak_bytes": request_bytes, "total_bytes": total_bytes, "fraction": fraction,
        "demo_args": ["--vram-fraction", str(fraction)],
    }  # fmt: skip
    doc["at_the_fraction"] = batches_at_fraction(model, device, side, fraction)
    doc["checks"] = {"measured": request_bytes > 0, "five_fit": doc["at_the_fraction"]["batch_5"]["ok"]}
    return doc


def forward(model: Any, images: Any, device: Any) -> None:
    import torch

    with torch.inference_mode():
        model(images.to(device))
    torch.cuda.synchronize(device)


def batches_at_fraction(model: Any, device: Any, side: int, fraction: float) -> dict[str, Any]:
    """Under the cap: the peak of one image again (cuDNN may now pick smaller workspaces than it did
    uncapped), five images at once fit, eight need not; and how many OOMs cuDNN caught itself while
    they ran (those raise `num_ooms` on passes that succeed: why the demo's probe leaves it out)."""
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction, device.index)
    torch.cuda.empty_cache()
    found: dict[str, Any] = {}
    for batch in (1, 5, 8):
        ooms_before = torch.cuda.memory_stats(device).get("num_ooms", 0)
        base_bytes = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            forward(model, torch.zeros(batch, 3, side, side), device)
            outcome: dict[str, Any] = {"ok": True}
        except Exception as exc:
            outcome = {"ok": False, "error": type(exc).__name__}
        outcome["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base_bytes
        outcome["num_ooms_delta"] = torch.cuda.memory_stats(device).get("num_ooms", 0) - ooms_before
        found[f"batch_{batch}"] = outcome
        torch.cuda.empty_cache()
    return found


def sizing_simulated(architecture: str, side: int) -> dict[str, Any]:
    """On the CPU the demo charges its simulated card the model's weights and each request's
    activation bytes: the card is sized from those, to hold five requests, as on the GPU."""
    import torch

    from demo_service.model import activation_bytes, build_model, weight_bytes

    model = build_model(architecture, num_classes=1000, seed=0, weights=None)
    weights = weight_bytes(model)
    request_bytes = activation_bytes(model, (1, 3, side, side), torch.device("cpu"))
    card_bytes = weights + (FIT_REQUESTS + 0.5) * request_bytes
    return {
        "simulated": True, "model": architecture, "image_side": side, "weights_bytes": weights,
        "request_peak_bytes": request_bytes, "total_bytes": int(card_bytes),
        "demo_args": ["--simulated-vram", str(int(card_bytes))],
        "checks": {"measured": request_bytes > 0},
    }  # fmt: skip


# --- demo ------------------------------------------------------------------------------------------


def demo_behind_the_gate(demo_args: list[str], burst: int) -> dict[str, Any]:
    """The demo with the gate: one /predict, a burst past what fits, the status, still serving."""
    from benchmarks.http_demo import Service

    # A high first limit, so that the burst runs out of memory and the gate has to learn.
    service = Service("adaptive", [*demo_args, "--initial-limit", str(burst), "--max-queue", str(4 * burst)])
    try:
        service.wait_ready()
        return asyncio.run(exercise(service.url, burst))
    except Exception as exc:
        return {"error": repr(exc), "service_output": service.output(), "checks": {"served": False}}
    finally:
        service.stop()


async def exercise(url: str, burst: int) -> dict[str, Any]:
    import httpx

    from benchmarks.http_demo import png

    async def predict(client: httpx.AsyncClient, seed: int) -> httpx.Response:
        return await client.post("/predict", files={"file": (f"{seed}.png", png(seed), "image/png")})

    # A batch of more images than the card holds: a real OOM inside the route, whatever the limit.
    oversize = [("files", (f"{i}.png", png(i), "image/png")) for i in range(OVERSIZE_BATCH)]
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = await predict(client, 0)
        answers = await asyncio.gather(*(predict(client, i) for i in range(burst)))
        after_burst = (await client.get("/gate/status")).json()
        too_big = await client.post("/predict/batch", files=oversize)
        status = (await client.get("/gate/status")).json()
        last = await predict(client, 1)
    counters = status.get("counters", {})
    doc: dict[str, Any] = {
        "first": {"status": first.status_code, "body": first.json() if first.status_code == 200 else first.text},
        "burst": dict(Counter(str(a.status_code) for a in answers)),
        "burst_reasons": dict(Counter(reason(a) for a in answers if a.status_code != 200)),
        "limit_after_burst": after_burst.get("limit"),
        "oversize_batch": {"images": OVERSIZE_BATCH, "status": too_big.status_code, "reason": reason(too_big)},
        "status_after_oom": {key: status.get(key) for key in ("limit", "in_flight", "queued", "memory", "probe")},
        "counters": counters,
        "last": last.status_code,
    }
    doc["checks"] = {
        "served": first.status_code == 200,
        "burst_answered": all(a.status_code in (200, 503) for a in answers),
        "oom_answered_503": too_big.status_code == 503,
        "oom_counted": (counters.get("ooms") or 0) >= 1,
        "still_serving": last.status_code == 200,
    }
    return doc


def reason(answer: Any) -> str:
    try:
        return str(answer.json().get("reason") or answer.json().get("detail") or answer.status_code)
    except ValueError:
        return str(answer.status_code)


# --- command line ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["env", "probes", "sizing", "demo"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-side", type=int, default=1024)
    parser.add_argument("--demo-args", default="", help="the demo's device and card flags, as one string")
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--rehearse", action="store_true", help="without CUDA, run on a SimulatedGPU, not fail")
    args = parser.parse_args(argv)
    if args.step == "env":
        return write(args.out, "env", environment())
    if args.step in ("probes", "sizing") and not args.rehearse and not cuda_available():
        # On the GPU run a simulated figure would pass for a real one: say what is missing instead.
        return write(args.out, args.step, {"error": "torch sees no CUDA device (--rehearse runs the CPU twin)",
                                            "checks": {"cuda_available": False}})  # fmt: skip
    if args.step == "probes":
        return write(args.out, "probes", probes_on_cuda() if cuda_available() else probes_simulated())
    if args.step == "sizing":
        size = sizing_on_cuda if cuda_available() else sizing_simulated
        return write(args.out, "sizing", size(args.model, args.image_side))
    return write(args.out, "demo", demo_behind_the_gate(shlex.split(args.demo_args), args.burst))


if __name__ == "__main__":
    sys.exit(main())
