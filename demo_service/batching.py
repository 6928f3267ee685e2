"""`--batching on|off`: `/predict` through `adaptive_gate.batch`, one forward pass for many callers.

On by default on CUDA, where a batch of images costs little more than one; off on the CPU, where
the 2-core machine ran ResNet-50 at 15.5 img/s alone, 14.2 in fours and 10.2 in eights. Turned on
there anyway, the batcher's knee has to find that small batches are best by itself.

With batching on, the gate in front counts items, not forward passes: its controller is the
batcher's (`gate_controller()`), so that enough callers reach the batcher for batches to form.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
import torch
from fastapi import FastAPI, File, Request, UploadFile

from adaptive_gate import Batched, batch
from adaptive_gate.probes import Probe

from .inference import Classifier, Prediction, decode_image

__all__ = ["add_batched_predict", "batched_classifier", "batching_on"]

MAX_WAIT_S = 0.005


def batching_on(setting: str, device: torch.device) -> bool:
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"--batching must be auto, on or off, got {setting!r}")
    return device.type == "cuda" if setting == "auto" else setting == "on"


Classified = tuple[list[Prediction], float, int]  # top-5, the batch's inference ms, the batch's size


def batched_classifier(app: FastAPI, probe: Probe | str | None) -> Batched[torch.Tensor, Classified]:
    """Images in, (top-5, the batch's inference ms, the batch's size) out, one per image."""

    @batch(probe=probe, max_wait_s=MAX_WAIT_S)
    def classify_images(images: list[torch.Tensor]) -> list[tuple[list[Prediction], float, int]]:
        classifier: Classifier = app.state.classifier
        results, inference_ms = classifier.predict(images)
        return [(top5, inference_ms, len(images)) for top5 in results]

    return classify_images


def add_batched_predict(
    app: FastAPI,
    batched: Batched[torch.Tensor, Classified],
    *,
    read: Any,
    max_file_bytes: int,
    max_pixels: int,
    side: int,
    device_text: Any,
) -> None:
    """`POST /predict` (gated): decode in a worker thread, then join the next batch."""

    @app.post("/predict", tags=["gpu"])
    async def predict(request: Request, file: Annotated[UploadFile, File()]) -> dict[str, Any]:
        def decode() -> torch.Tensor:
            return decode_image(read(file, max_file_bytes), max_pixels=max_pixels, side=side)

        image = await anyio.to_thread.run_sync(decode)
        top5, inference_ms, batch_size = await batched(image)
        return {
            "top5": [{"label": p.label, "score": p.score} for p in top5],
            "device": device_text(request.app.state.classifier),
            "inference_ms": round(inference_ms, 3),
            "batch_size": batch_size,
        }
