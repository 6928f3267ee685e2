"""The demo service: a pretrained ImageNet classifier behind the gate, as a user would write it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import anyio.to_thread
import torch
from fastapi import FastAPI, File, Request, UploadFile
from fastapi.responses import JSONResponse
from starlette.types import Scope

from adaptive_gate import AdaptiveGate
from adaptive_gate.probes import Probe, auto_probe
from adaptive_gate.testing import SimulatedGPU

from .batching import add_batched_predict, batched_classifier, batching_on
from .inference import BadImage, Classifier, decode_image, load_classifier
from .model import DEFAULT_MODEL, default_labels
from .policies import SemaphoreMiddleware, parse_policy

logger = logging.getLogger("demo_service")

MiB = 2**20


@dataclass(frozen=True)
class Settings:
    device: str = "auto"
    architecture: str = DEFAULT_MODEL
    weights: Path | None = None
    labels: Path | None = None
    seed: int = 0
    # About nine single images fit beside EfficientNet-Lite0's weights (18 MiB + 75 MiB each), four
    # beside ResNet-50's (98 MiB + 138 MiB each): the gate has a number to find either way.
    simulated_vram_bytes: int = 768 * MiB
    vram_fraction: float | None = None
    max_files: int = 16
    max_pixels: int = 4096 * 4096
    max_file_bytes: int = 20 * MiB
    image_side: int = 224  # inputs are resized to side x side: larger sides need more memory per image
    policy: str = "adaptive"
    batching: str = "auto"  # /predict through adaptive_gate.batch: auto (on for CUDA), on, off
    gate: dict[str, Any] = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use auto or cpu)")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device must be auto, cpu or cuda[:N], got {name!r}")
    return device


def cuda_index(device: torch.device) -> int:
    """The index of a CUDA device; plain `cuda` means the current one.

    `set_per_process_memory_fraction` and the probes need an index, and `torch.device("cuda")` has
    none: passing it raised "Expected a torch.device with a specified index" at start-up.
    """
    if device.type != "cuda":
        raise ValueError(f"{device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


def cuda_probe(device: torch.device, vram_fraction: float | None) -> Probe | None:
    """Cap PyTorch at `vram_fraction` of the card where one is given; the probe that watches it.

    The demo's routes catch no OOM, so every one reaches the gate as an error; the allocator's
    `num_ooms` would add only those cuDNN catches itself while it looks for a workspace that fits,
    on requests that succeed. So the probes leave the count out (`count_ooms=False`).
    """
    index = cuda_index(device)
    if vram_fraction is not None:
        if not 0 < vram_fraction <= 1:
            raise ValueError(f"--vram-fraction must be in (0, 1], got {vram_fraction}")
        # The probes read the card within the share PyTorch is capped at (`TorchCudaProbe.capped`).
        torch.cuda.set_per_process_memory_fraction(vram_fraction, index)
    return auto_probe(index, count_ooms=False)[0]


def read_labels(path: Path | None, architecture: str) -> list[str]:
    if path is None:
        return default_labels(architecture)
    labels = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(labels) < 2:
        raise ValueError(f"{path}: a labels file needs one label per line, at least two")
    return labels


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    policy, static_limit = parse_policy(settings.policy)
    device = resolve_device(settings.device)
    labels = read_labels(settings.labels, settings.architecture)
    gpu: SimulatedGPU | None = None
    probe: Probe | str | None = "auto"
    if device.type == "cuda":
        probe = cuda_probe(device, settings.vram_fraction)
    else:
        gpu = SimulatedGPU(settings.simulated_vram_bytes)
        probe = gpu

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if static_limit is not None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = static_limit
        app.state.classifier = await anyio.to_thread.run_sync(
            lambda: load_classifier(
                architecture=settings.architecture,
                device=device,
                weights=settings.weights,
                labels=labels,
                seed=settings.seed,
                gpu=gpu,
                side=settings.image_side,
            )
        )
        logger.info("demo_service: %s", describe(settings, device, app.state.classifier, policy))
        yield

    app = FastAPI(title="adaptive-gate demo", lifespan=lifespan)
    # Behind the adaptive gate the batcher reads the card through the gate's sampler; behind the
    # others it reads the same probe itself (on the CPU, the simulated card).
    batched = batched_classifier(app, probe) if batching_on(settings.batching, device) else None
    if policy == "adaptive":
        # A batch may hold max_files files of max_file_bytes each (plus the form's own bytes): the
        # gate reads a body whole before it may take a slot, so it must allow that much.
        batch_bytes = settings.max_files * settings.max_file_bytes + MiB
        bounds: dict[str, Any] = {"max_body_bytes": batch_bytes, "max_buffered_bytes": max(256 * MiB, batch_bytes)}
        bounds["cost"] = lambda scope: files_declared(scope, settings.max_files)  # what a batch weighs
        # With batching, the gate counts items for the batcher (its controller), not forward passes.
        controller = {} if batched is None else {"controller": batched.gate_controller()}
        app.add_middleware(AdaptiveGate, probe=probe, **controller, **(bounds | settings.gate))
    elif policy == "static":
        app.add_middleware(SemaphoreMiddleware, limit=static_limit)

    @app.exception_handler(BadImage)
    async def bad_image(request: Request, exc: BadImage) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    def classify(request: Request, uploads: list[UploadFile]) -> dict[str, Any]:
        if len(uploads) > settings.max_files:
            raise BadImage(413, f"{len(uploads)} files sent, at most {settings.max_files} per request")
        images = [
            decode_image(read_upload(upload, settings.max_file_bytes), max_pixels=settings.max_pixels,
                         side=settings.image_side)
            for upload in uploads
        ]  # fmt: skip
        classifier: Classifier = request.app.state.classifier
        results, inference_ms = classifier.predict(images)
        return {
            "results": [[{"label": p.label, "score": p.score} for p in top5] for top5 in results],
            "device": device_text(classifier),
            "inference_ms": round(inference_ms, 3),
        }

    if batched is not None:
        add_batched_predict(
            app,
            batched,
            read=read_upload,
            max_file_bytes=settings.max_file_bytes,
            max_pixels=settings.max_pixels,
            side=settings.image_side,
            device_text=device_text,
        )
    else:

        @app.post("/predict", tags=["gpu"])
        def predict(request: Request, file: Annotated[UploadFile, File()]) -> dict[str, Any]:
            answer = classify(request, [file])
            return {"top5": answer["results"][0], "device": answer["device"], "inference_ms": answer["inference_ms"]}

    @app.post("/predict/batch", tags=["gpu"])
    def predict_batch(request: Request, files: Annotated[list[UploadFile], File()]) -> dict[str, Any]:
        declared = request.query_params.get("files")
        if declared is not None and declared != str(len(files)):
            # The gate admitted it at the declared weight: a batch heavier than said must not pass.
            raise BadImage(400, f"?files={declared} declared, {len(files)} files sent")
        return classify(request, files)

    if gpu is not None:
        simulated = gpu

        @app.put("/simulated-gpu/neighbour")
        def set_neighbour(nbytes: int) -> dict[str, int]:
            """Demo and benchmark control: another process now wants `nbytes` of the simulated card.
            It takes what is free now and the rest as our requests free it (`held_bytes` says how
            much it holds so far)."""
            if not 0 <= nbytes <= simulated.total_bytes:
                raise BadImage(422, f"nbytes must be within [0, {simulated.total_bytes}]")
            simulated.set_neighbour(nbytes)
            return {
                "neighbour_bytes": nbytes,
                "held_bytes": simulated.neighbour_bytes,
                "used_bytes": simulated.used_bytes,
            }

    @app.get("/healthz")
    def healthz(request: Request) -> dict[str, Any]:
        return {"ok": True, "model_loaded": hasattr(request.app.state, "classifier")}

    return app


def files_declared(scope: Scope, max_files: int) -> float:
    """The gate's cost: a batch weighs the number of files it declares in `?files=N` (checked by the
    route against what it sent, and at most `max_files`, which the route enforces too), so the gate
    admits batches by the memory they take; a request that declares nothing weighs one."""
    for key, _, value in (pair.partition(b"=") for pair in scope["query_string"].split(b"&")):
        if key == b"files" and value.isdigit() and int(value) >= 1:
            return float(min(int(value), max_files))
    return 1.0


def read_upload(upload: UploadFile, max_bytes: int) -> bytes:
    data = upload.file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BadImage(413, f"{upload.filename or 'the file'} is larger than {max_bytes} bytes")
    if not data:
        raise BadImage(400, f"{upload.filename or 'the file'} is empty")
    return data


def device_text(classifier: Classifier) -> str:
    if classifier.gpu is not None:
        return f"cpu (simulated GPU of {classifier.gpu.total_bytes // MiB} MiB)"
    return str(classifier.device)


def describe(settings: Settings, device: torch.device, classifier: Classifier, policy: str) -> str:
    if classifier.gpu is not None:
        card = (
            f"simulated card {classifier.gpu.total_bytes // MiB} MiB, weights {classifier.gpu.used_bytes // MiB} MiB, "
            f"{classifier.bytes_for((1, 3, classifier.side, classifier.side)) // MiB} MiB per image"
        )
        probe = "SimulatedGPU"
    else:
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = settings.vram_fraction or 1.0
        card = f"{torch.cuda.get_device_name(device)}, {int(total * fraction) // MiB} MiB usable"
        capped = " within the fraction PyTorch is capped at" if settings.vram_fraction else ""
        probe = f"auto (NVML, torch.cuda){capped}"
    shown = {name: "(set)" if name == "admin_token" else value for name, value in settings.gate.items()}
    return (
        f"device={device} model={settings.architecture} {card}; probe={probe}; policy={settings.policy}; "
        f"batching={settings.batching}; "
        f"gate options={shown or 'defaults'}"
    )
